#!/usr/bin/env bash
# Instructions per request of a metrics middleware in an axum app (issue 27): the
# `tailguard-axum-bench` hello-world under callgrind, once per middleware (none,
# axum-prometheus, tailguard), serving N requests from `tailguard load` with no scrape; the
# counters are zeroed after a warm-up and dumped after the measured requests, so start-up
# and the dummy series' creation are not counted. Prints each middleware's instructions per
# request (all threads, the tailguard exporter's included) and the difference to the bare
# app. Instruction counts do not depend on the machine being quiet.
#   REQUESTS=10000 RATE=500 SERIES=100000 lab/callgrind-axum.sh
set -euo pipefail
cd "$(dirname "$0")/.."
app=${APP:-target/release/tailguard-axum-bench}
tg=${TAILGUARD:-target/release/tailguard}
rate=${RATE:-500}
requests=${REQUESTS:-10000}
conns=${CONNECTIONS:-32}
series=${SERIES:-100000}
out=${OUT:-$(mktemp -d /tmp/callgrind-axum.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in valgrind callgrind_control callgrind_annotate python3 curl; do
  command -v "$tool" >/dev/null || { echo "callgrind-axum: $tool is not installed" >&2; exit 1; }
done
for exe in "$app" "$tg"; do
  [ -x "$exe" ] || { echo "callgrind-axum: $exe is missing (cargo build --release -p tailguard -p tailguard-axum-bench)" >&2; exit 1; }
done
prio=()
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
secs=$(( (requests + rate - 1) / rate ))
declare -A per_request
for mw in none axum-prometheus tailguard; do
  port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$out/$mw.%p" \
    "$app" --listen "127.0.0.1:$port" --middleware "$mw" --synthetic-series "$series" \
    > "$out/$mw.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  # Creating the dummy series under callgrind takes a while: wait up to 10 minutes.
  for _ in $(seq 6000); do curl -fs -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
  curl -fs -o /dev/null "http://127.0.0.1:$port/" \
    || { echo "callgrind-axum: the $mw app does not answer ($out/$mw.log)" >&2; exit 1; }
  "$tg" load "http://127.0.0.1:$port/" --rate "$rate" --duration 3s --connections "$conns" --brief > /dev/null
  callgrind_control --zero "$pid" > /dev/null 2>&1
  "$tg" load "http://127.0.0.1:$port/" --rate "$rate" --duration "${secs}s" --connections "$conns" \
    --brief --json "$out/$mw-load.json" > "$out/$mw-load.txt"
  callgrind_control --dump=measured "$pid" > /dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  done_n=$(python3 -c "import json; print(json.load(open('$out/$mw-load.json'))['completed'])")
  # The dump taken after the measured requests (`.1`; the exit's own dump has no suffix).
  total=0
  for dump in "$out/$mw.$pid".*; do
    [ -f "$dump" ] || continue
    n=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1; exit}')
    total=$((total + ${n:-0}))
  done
  [ "$total" -gt 0 ] || { echo "callgrind-axum: no measured dump for $mw in $out" >&2; exit 1; }
  per_request[$mw]=$((total / done_n))
  echo "$mw: $done_n requests measured, ${per_request[$mw]} instructions per request"
done
echo
echo "over the bare app: axum-prometheus +$((per_request[axum-prometheus] - per_request[none])), tailguard +$((per_request[tailguard] - per_request[none])) instructions per request ($series dummy series, no scrape)"
