# The record of the run (paths as they were on the VM): the gateway config is gw.toml here;
# the origin was nginx (one worker, `return 200 "hello, world\n"`) on 127.0.0.1:18081.
set -e
cd /tmp/pk
for round in 1 2; do
for park in 1000 0; do
  cp gw.toml gw-p.toml; printf '[timeouts]\npark_ms = %s\n' $park >> gw-p.toml
  RUST_LOG=warn taskset -c 1 /work/bench/tailguard-s6-pgo run --config gw-p.toml --threads 1 --metrics-listen 127.0.0.1:18090 > gw.log 2>&1 &
  p=$!
  sleep 1
  taskset -c 0 /work/bench/tailguard-s6-pgo load http://127.0.0.1:18080/ --rate 300 --duration 25s --connections 500 --json /tmp/pk/lat-$park-$round.json > /tmp/pk/lat-$park-$round.txt 2>&1
  parked=$(curl -s http://127.0.0.1:18090/metrics | grep '^tailguard_downstream_connections_parked ' | awk '{print $2}')
  echo "round $round park_ms=$park parked_at_end=$parked"
  grep -iE "p50|p99|p99.9|max|p100|completed|errors" /tmp/pk/lat-$park-$round.txt | head -8
  kill $p; wait $p || true
done
done
