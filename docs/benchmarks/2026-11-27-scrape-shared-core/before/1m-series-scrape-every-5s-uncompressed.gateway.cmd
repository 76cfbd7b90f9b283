/tmp/scrape-ev/tailguard-before run --listen 127.0.0.1:41693 --upstream demo=127.0.0.1:45971 --metrics-listen 127.0.0.1:46287 --threads 1 --synthetic-series 1000000
