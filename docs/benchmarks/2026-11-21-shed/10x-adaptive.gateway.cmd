/work/wt/lab/target/release/tailguard run --listen 127.0.0.1:42937 --upstream demo=127.0.0.1:39291 --metrics-listen 127.0.0.1:39073 --threads 1 --overload adaptive
