/work/wt/lab/target/release/tailguard run --listen 127.0.0.1:42815 --upstream demo=127.0.0.1:35065 --metrics-listen 127.0.0.1:42011 --threads 1
