#!/usr/bin/env bash
# H: the loadgen scrapes a second, idle app on the same core instead of the loaded one.
set -u
cd /work/main
out=/tmp/first-scrape
for seed in 31 32 33 34; do
  for mode in H; do
    taskset -c 1 nice -n -10 target/release/tailguard-axum-bench --listen 127.0.0.1:18080 --metrics-listen 127.0.0.1:18091 --middleware tailguard --synthetic-series 100000 > $out/app.log 2>&1 &
    app=$!
    taskset -c 1 nice -n -10 target/release/tailguard-axum-bench --listen 127.0.0.1:18081 --metrics-listen 127.0.0.1:18092 --middleware tailguard --synthetic-series 100000 > $out/app2.log 2>&1 &
    app2=$!
    for _ in $(seq 100); do curl -fs -o /dev/null http://127.0.0.1:18080/ && curl -fs -o /dev/null http://127.0.0.1:18081/ && break; sleep 0.1; done
    target/release/tailguard load http://127.0.0.1:18080/ --rate 70000 --duration 20s --warmup 3s --connections 64 --threads 1 --pin 0 --nice -10 --poisson --seed $seed --scrape http://127.0.0.1:18092/metrics --every 5s --brief --json $out/$mode-$seed.json > $out/$mode-$seed.txt 2>&1
    kill $app $app2; wait $app $app2 2>/dev/null
  done
done
