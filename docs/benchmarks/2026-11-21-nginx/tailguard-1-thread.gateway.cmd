/work/wt/lab/target/release/tailguard run --listen 127.0.0.1:40565 --upstream demo=127.0.0.1:38991 --metrics-listen 127.0.0.1:34701 --threads 1
