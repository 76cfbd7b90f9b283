/work/wt/lab/target/release/tailguard run --listen 127.0.0.1:45515 --upstream demo=127.0.0.1:36161 --metrics-listen 127.0.0.1:38987 --threads 1 --synthetic-series 100000
