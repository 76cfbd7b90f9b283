/work/wt/lab/target/release/tailguard run --listen 127.0.0.1:41459 --upstream demo=127.0.0.1:36161 --metrics-listen 127.0.0.1:46641 --threads 1 --synthetic-series 100000
