/tmp/scrape-ev/tailguard-after run --listen 127.0.0.1:35563 --upstream demo=127.0.0.1:41463 --metrics-listen 127.0.0.1:41241 --threads 1 --synthetic-series 1000000
