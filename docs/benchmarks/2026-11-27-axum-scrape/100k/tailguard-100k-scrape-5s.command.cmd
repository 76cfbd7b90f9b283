/work/wt/libs/target/release/tailguard-axum-bench --listen 127.0.0.1:46711 --metrics-listen 127.0.0.1:40357 --middleware tailguard --synthetic-series 100000
