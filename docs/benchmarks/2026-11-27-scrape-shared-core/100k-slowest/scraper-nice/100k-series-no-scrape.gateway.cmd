/work/main/target/release/tailguard run --listen 127.0.0.1:35847 --upstream demo=127.0.0.1:33701 --metrics-listen 127.0.0.1:33055 --threads 1 --synthetic-series 100000
