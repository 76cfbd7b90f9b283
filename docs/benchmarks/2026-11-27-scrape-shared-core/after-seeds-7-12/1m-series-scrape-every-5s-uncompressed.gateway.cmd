/work/main/target/release/tailguard run --listen 127.0.0.1:39567 --upstream demo=127.0.0.1:39745 --metrics-listen 127.0.0.1:38225 --threads 1 --synthetic-series 1000000
