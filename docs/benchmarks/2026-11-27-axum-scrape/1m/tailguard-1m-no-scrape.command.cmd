/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:38581 --metrics-listen 127.0.0.1:35117 --middleware tailguard --synthetic-series 1000000
