/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:44275 --metrics-listen 127.0.0.1:46859 --middleware tailguard --synthetic-series 100000
