/work/main/target/release/tailguard run --listen 127.0.0.1:38093 --upstream demo=127.0.0.1:45235 --metrics-listen 127.0.0.1:34153 --threads 1 --synthetic-series 100000
