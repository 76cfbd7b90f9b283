/work/wt/lab/target/release/tailguard run --listen 127.0.0.1:39973 --upstream demo=127.0.0.1:36161 --metrics-listen 127.0.0.1:33129 --threads 1 --synthetic-series 0
