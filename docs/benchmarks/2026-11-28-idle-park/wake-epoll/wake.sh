#!/bin/bash
# Wake latency and CPU per request when most requests wake a parked connection.
set -e
cd /tmp/pk
taskset -c 0 nginx -c /tmp/pk/origin.conf -p /tmp/pk & ng=$!
sleep 1
tck=$(getconf CLK_TCK)
for round in 1 2; do
for b in a62087d epoll2; do
  park=1000
  cp gw.toml gw-p.toml; printf '[timeouts]\npark_ms = %s\n' $park >> gw-p.toml
  RUST_LOG=warn taskset -c 1 /work/bench/tailguard-$b run --config gw-p.toml --threads 1 --metrics-listen 127.0.0.1:18090 > gw.log 2>&1 &
  p=$!
  sleep 1
  s0=$(awk '{print $14+$15}' /proc/$p/stat)
  taskset -c 0 /work/bench/tailguard-epoll2 load http://127.0.0.1:18080/ --rate 300 --duration 25s --connections 500 --json /tmp/pk/lat-$b-$round.json > /tmp/pk/lat-$b-$round.txt 2>&1
  s1=$(awk '{print $14+$15}' /proc/$p/stat)
  parked=$(curl -s http://127.0.0.1:18090/metrics | grep '^tailguard_downstream_connections_parked ' | awk '{print $2}')
  echo "round $round $b parked_at_end=$parked cpu_ticks=$((s1-s0)) (tck $tck, 7500 requests)"
  grep -iE "p50|p99|max|p100|completed|errors" /tmp/pk/lat-$b-$round.txt | head -8
  kill $p; wait $p || true
done
done
kill $ng
