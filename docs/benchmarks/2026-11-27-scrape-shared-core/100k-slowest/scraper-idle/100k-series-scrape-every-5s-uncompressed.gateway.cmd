/work/main/target/release/tailguard run --listen 127.0.0.1:40117 --upstream demo=127.0.0.1:35139 --metrics-listen 127.0.0.1:36123 --threads 1 --synthetic-series 100000
