/work/wt/lab/target/release/tailguard run --listen 127.0.0.1:45893 --upstream demo=127.0.0.1:39291 --metrics-listen 127.0.0.1:45329 --threads 1 --overload gozero
