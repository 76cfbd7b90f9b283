/tmp/scrape-ev/tailguard-after run --listen 127.0.0.1:45895 --upstream demo=127.0.0.1:41463 --metrics-listen 127.0.0.1:44993 --threads 1 --synthetic-series 1000000
