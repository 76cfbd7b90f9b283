/work/main/target/release/tailguard run --listen 127.0.0.1:37405 --upstream demo=127.0.0.1:39745 --metrics-listen 127.0.0.1:43149 --threads 1 --synthetic-series 1000000
