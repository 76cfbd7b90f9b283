/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:43901 --middleware axum-prometheus --synthetic-series 1000000
