/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:32817 --metrics-listen 127.0.0.1:34069 --middleware tailguard --synthetic-series 100000
