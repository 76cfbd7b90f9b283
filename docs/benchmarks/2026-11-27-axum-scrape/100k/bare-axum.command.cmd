/work/wt/libs/target/release/tailguard-axum-bench --listen 127.0.0.1:37475 --middleware none
