/work/wt/libs/target/release/tailguard-axum-bench --listen 127.0.0.1:37255 --middleware axum-prometheus --synthetic-series 100000
