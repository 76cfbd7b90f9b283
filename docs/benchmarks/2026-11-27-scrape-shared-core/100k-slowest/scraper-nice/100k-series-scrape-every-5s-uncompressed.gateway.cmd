/work/main/target/release/tailguard run --listen 127.0.0.1:41957 --upstream demo=127.0.0.1:33701 --metrics-listen 127.0.0.1:46687 --threads 1 --synthetic-series 100000
