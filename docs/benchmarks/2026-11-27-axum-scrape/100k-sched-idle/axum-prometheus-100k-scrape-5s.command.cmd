/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:45177 --middleware axum-prometheus --synthetic-series 100000
