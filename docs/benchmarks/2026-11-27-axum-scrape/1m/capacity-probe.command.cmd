/work/main/target/release/tailguard-axum-bench --listen 127.0.0.1:33643 --middleware none
