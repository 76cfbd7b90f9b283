/tmp/scrape-ev/tailguard-after run --listen 127.0.0.1:34325 --upstream demo=127.0.0.1:44113 --metrics-listen 127.0.0.1:36523 --threads 1 --synthetic-series 100000
