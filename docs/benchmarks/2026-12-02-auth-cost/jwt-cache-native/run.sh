#!/usr/bin/env bash
# Native: jwt-rs CPU per request at RATE with 1,000 tokens (each again every 1000/RATE s) vs 50 tokens.
set -eu
cd /work/wt/authlab
out=/tmp/authlab-native; mkdir -p $out; prio=(nice -n -10)
. lab/lib.sh
trap cleanup EXIT
start_origin 0
L=/work/wt/authlab-bin/tailguard-load; B=/work/bin/tailguard-091bde7; rate=${RATE:-1000}
sed -E "0,/address = \"127.0.0.1:[0-9]+\" \}/s//address = \"127.0.0.1:$up_port\" }/" /tmp/authlab-cpu1/jwt-rs.toml > $out/jwt-rs.toml
for r in 1 2 3; do
for n in 1000 50 open; do
  toks=/tmp/authlab-cpu1/rs256.tokens; [ $n = 50 ] && toks=/tmp/authlab-dir50/rs256.tokens
  cfg=$out/jwt-rs.toml
  if [ $n = open ]; then sed -E "0,/address = \"127.0.0.1:[0-9]+\" \}/s//address = \"127.0.0.1:$up_port\" }/" /tmp/authlab-cpu1/open-rs.toml > $out/open-rs.toml; cfg=$out/open-rs.toml; fi
  port=$(free_port)
  "${prio[@]}" taskset -c 1 $B run --config $cfg --threads 1 --listen 127.0.0.1:$port --metrics-listen 127.0.0.1:0 > $out/gw.log 2>&1 &
  gw=$!; pids+=($gw)
  for _ in $(seq 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$port/)" != 000 ] && break; sleep 0.05; done
  "${prio[@]}" $L load http://127.0.0.1:$port/ --rate $rate --duration 3s --connections 8 --pin 0 --brief --header-file "authorization: $toks" > /dev/null
  b=$(awk '{print $14+$15}' /proc/$gw/stat)
  "${prio[@]}" $L load http://127.0.0.1:$port/ --rate $rate --duration 10s --connections 8 --pin 0 --brief --header-file "authorization: $toks" --json $out/l.json > /dev/null
  a=$(awk '{print $14+$15}' /proc/$gw/stat)
  kill $gw; wait $gw 2>/dev/null || true
  python3 -c "import json; r=json.load(open('$out/l.json')); print('round $r, $rate req/s, tokens $n:', r['status'], round(($a-$b)*1e4/r['completed'],1), 'us/req')"
done; done
