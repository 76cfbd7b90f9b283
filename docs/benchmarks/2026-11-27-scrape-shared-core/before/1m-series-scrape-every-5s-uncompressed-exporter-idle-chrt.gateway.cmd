/tmp/scrape-ev/tailguard-before run --listen 127.0.0.1:45799 --upstream demo=127.0.0.1:45971 --metrics-listen 127.0.0.1:42475 --threads 1 --synthetic-series 1000000 --metrics-priority idle
