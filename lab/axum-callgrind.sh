#!/usr/bin/env bash
# Instructions per request of each axum-scrape target (tailguard-axum-bench: bare, with
# axum-prometheus, with tailguard-metrics) under callgrind: the CPU-per-request comparison
# of `tailguard lab axum-scrape` without the noise of a shared machine's timing. Each
# middleware runs twice, with N1 and N2 requests (GET /, keep-alive, `tailguard load` at a
# rate callgrind keeps up with); instructions per request = (I(N2) - I(N1)) / (N2 - N1), so
# start-up and shutdown cancel out. A middleware's cost is its figure minus the bare app's.
#   cargo build --release -p tailguard -p tailguard-axum-bench && lab/axum-callgrind.sh
# Instruction counts do not depend on the machine's load: no quiet machine needed.
set -euo pipefail
cd "$(dirname "$0")/.."
tg=${TAILGUARD:-target/release/tailguard}
app=${APP:-target/release/tailguard-axum-bench}
rate=${RATE:-400}
d1=${D1:-3}
d2=${D2:-9}
out=${OUT:-$(mktemp -d /tmp/axum-callgrind.XXXXXX)}
mkdir -p "$out"
for exe in "$tg" "$app"; do [ -x "$exe" ] || { echo "axum-callgrind: build $exe first" >&2; exit 1; }; done
command -v valgrind >/dev/null || { echo "axum-callgrind: valgrind is not installed" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Total instructions (Ir) of one run of middleware $1 serving $2 seconds of load.
run() {
  local mw=$1 secs=$2 port pid file
  port=$(free_port)
  file="$out/$mw-${secs}s.callgrind"
  valgrind --tool=callgrind --callgrind-out-file="$file" \
    "$app" --listen "127.0.0.1:$port" --metrics-listen 127.0.0.1:0 --middleware "$mw" \
    > "$out/$mw-${secs}s.out" 2> "$out/$mw-${secs}s.valgrind" &
  pid=$!
  for _ in $(seq 600); do
    curl -fs -o /dev/null "http://127.0.0.1:$port/healthz" && break
    sleep 0.1
  done
  "$tg" load "http://127.0.0.1:$port/" --rate "$rate" --duration "${secs}s" --connections 4 \
    --brief --json "$out/$mw-${secs}s.json" > "$out/$mw-${secs}s.load" 2>&1
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
  local requests
  requests=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['completed'])" "$out/$mw-${secs}s.json")
  # Two health checks... at most: the readiness probe's requests are in both runs alike.
  echo "$requests $(sed -n 's/^summary: //p' "$file" | awk '{print $1}')"
}

printf '%-16s %12s %12s %14s\n' middleware requests_diff ir_diff ir_per_request
for mw in none axum-prometheus tailguard; do
  read -r n1 i1 < <(run "$mw" "$d1")
  read -r n2 i2 < <(run "$mw" "$d2")
  python3 -c "import sys; n1,i1,n2,i2=map(int,sys.argv[2:]); print(f'{sys.argv[1]:<16} {n2-n1:>12} {i2-i1:>12} {(i2-i1)/(n2-n1):>14.0f}')" "$mw" "$n1" "$i1" "$n2" "$i2"
done | tee "$out/summary.txt"
echo "raw files: $out"
