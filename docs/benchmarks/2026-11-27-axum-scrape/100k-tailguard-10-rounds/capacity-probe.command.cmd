/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:37625 --middleware none
