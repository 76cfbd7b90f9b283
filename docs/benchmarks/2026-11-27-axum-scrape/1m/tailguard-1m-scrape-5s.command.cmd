/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:43879 --metrics-listen 127.0.0.1:33749 --middleware tailguard --synthetic-series 1000000
