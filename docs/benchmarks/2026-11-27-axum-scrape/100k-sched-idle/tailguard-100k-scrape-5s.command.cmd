/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:40269 --metrics-listen 127.0.0.1:45593 --middleware tailguard --synthetic-series 100000
