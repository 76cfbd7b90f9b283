/work/main/target/release/tailguard run --listen 127.0.0.1:38177 --upstream demo=127.0.0.1:35139 --metrics-listen 127.0.0.1:45483 --threads 1 --synthetic-series 100000
