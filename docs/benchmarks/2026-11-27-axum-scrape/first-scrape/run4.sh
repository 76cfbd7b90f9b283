#!/usr/bin/env bash
set -u
cd /work/main
out=/tmp/first-scrape
for seed in 34 35 36 37; do
  for mode in E; do
    taskset -c 1 nice -n -10 target/release/tailguard-axum-bench --listen 127.0.0.1:18080 --metrics-listen 127.0.0.1:18091 --middleware tailguard --synthetic-series 100000 > $out/app.log 2>&1 &
    app=$!
    for _ in $(seq 100); do curl -fs -o /dev/null http://127.0.0.1:18080/ && break; sleep 0.1; done
    ( sleep 2.5; for i in 1 2 3 4 5; do t0=$(date +%s.%N); taskset -c 0 chrt -i 0 curl -s -H 'Accept-Encoding: gzip' -o /dev/null http://127.0.0.1:18091/metrics; echo "$t0 $(date +%s.%N)" >> $out/$mode-$seed.scrapes; sleep 4.9; done ) &
    scr=$!
    echo "load-start $(date +%s.%N)" > $out/$mode-$seed.scrapes
    target/release/tailguard load http://127.0.0.1:18080/ --rate 70000 --duration 20s --warmup 3s --connections 64 --threads 1 --pin 0 --nice -10 --poisson --seed $seed --brief --json $out/$mode-$seed.json > $out/$mode-$seed.txt 2>&1
    kill $scr 2>/dev/null; kill $app; wait $app 2>/dev/null
  done
done
