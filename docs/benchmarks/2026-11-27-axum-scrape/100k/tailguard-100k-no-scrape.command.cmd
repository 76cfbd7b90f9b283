/work/wt/libs/target/release/tailguard-axum-bench --listen 127.0.0.1:39699 --metrics-listen 127.0.0.1:44009 --middleware tailguard --synthetic-series 100000
