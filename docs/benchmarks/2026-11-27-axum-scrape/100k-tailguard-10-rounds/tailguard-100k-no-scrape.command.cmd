/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:46359 --metrics-listen 127.0.0.1:38543 --middleware tailguard --synthetic-series 100000
