/work/wt/libs/target/release/tailguard-axum-bench --listen 127.0.0.1:43195 --middleware axum-prometheus --synthetic-series 100000
