/work/wt/lab/target/release/tailguard run --listen 127.0.0.1:45639 --upstream demo=127.0.0.1:39291 --metrics-listen 127.0.0.1:44519 --threads 1 --overload adaptive
