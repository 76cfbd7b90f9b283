#!/usr/bin/env bash
# Instructions per request of the gateway's serving path, by function: tailguard under
# callgrind (one serving thread, metrics on, access log off) proxies N requests from
# `tailguard load` to an nginx origin (a fixed 13-byte body); the counters are zeroed after
# a warm-up and dumped after the measured requests, so start-up is not counted. Prints the
# total instructions per request and the top functions (inclusive and self) per request.
# Instruction counts do not depend on the machine being quiet.
#   REQUESTS=10000 RATE=500 [TAILGUARD=target/release/tailguard] lab/callgrind.sh
# START_WAIT=600 waits that many seconds for the gateway to listen (valgrind parses a big
# table slowly). URL_PATH=/t50000/api/items sends the load to that path instead of `/` (with EXTRA_CONFIG
# holding a large route table, to count what the table's size costs a request).
# EXTRA_CONFIG=file appends that TOML to the gateway's config (e.g. a `[tracing]` table, to
# count what a traced request costs); TRACE_SINK=1 [TRACE_RATIO=] appends one exporting to an
# OTLP sink (lab/lib.sh `start_otlp_sink`), so the exporter's work is that of a collector
# that answers.
# GATEWAY=nginx counts nginx instead, as lab/compare-cpu.sh configures it (lab/nginx/proxy.conf,
# one process: `master_process off`), so the two gateways' user-space work per request compares
# by instructions, not by tick-sampled user time. Debian's nginx is stripped: the per-function
# tables then name addresses, and only the total is meant to be read.
set -euo pipefail
cd "$(dirname "$0")/.."
exe=${TAILGUARD:-target/release/tailguard}
rate=${RATE:-500}
requests=${REQUESTS:-10000}
conns=${CONNECTIONS:-32}
top=${TOP:-40}
out=${OUT:-$(mktemp -d /tmp/callgrind.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx valgrind callgrind_control callgrind_annotate python3 curl; do
  command -v "$tool" >/dev/null || { echo "callgrind: $tool is not installed" >&2; exit 1; }
done
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
start_origin "0-$(($(nproc) - 1))"
if [ "${TRACE_SINK:-0}" = 1 ]; then start_otlp_sink "0-$(($(nproc) - 1))"; fi
gw_port=$(free_port)
{ proxy_config "127.0.0.1:$gw_port"; extra_config; } > "$out/gateway.toml"
if [ "${GATEWAY:-tailguard}" = nginx ]; then
  sed -e "s|@DIR@|$out|g" -e "s|@LISTEN@|127.0.0.1:$gw_port|g" -e "s|@UPSTREAM@|127.0.0.1:$up_port|g" \
    lab/nginx/proxy.conf > "$out/nginx.conf"
  valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out.%p" \
    nginx -c "$out/nginx.conf" -p "$out" -e "$out/nginx-error.log" -g "master_process off;" \
    > "$out/gateway.log" 2>&1 &
else
  RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out.%p" \
    "$exe" run --config "$out/gateway.toml" --threads 1 --metrics-listen 127.0.0.1:0 \
    > "$out/gateway.log" 2>&1 &
fi
gw=$!
pids+=("$gw")
# Valgrind starts the gateway slowly.
wait_port "$gw_port" "${START_WAIT:-60}"
path=${URL_PATH:-/}
"$exe" load "http://127.0.0.1:$gw_port$path" --rate "$rate" --duration 3s --connections "$conns" --brief > /dev/null
callgrind_control --zero "$gw" > /dev/null
secs=$(( (requests + rate - 1) / rate ))
"$exe" load "http://127.0.0.1:$gw_port$path" --rate "$rate" --duration "${secs}s" --connections "$conns" \
  --brief --json "$out/load.json" > "$out/load.txt"
callgrind_control --dump=measured "$gw" > /dev/null
kill "$gw"; wait "$gw" 2>/dev/null || true
done_n=$(python3 -c "import json; print(json.load(open('$out/load.json'))['completed'])")
dump=$(ls -t "$out"/callgrind.out.*.* 2>/dev/null | grep -v '\.0$' | head -1 || true)
[ -n "$dump" ] || dump=$(ls -t "$out"/callgrind.out.* | head -1)
total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1; exit}')
if [ "${GATEWAY:-tailguard}" = nginx ]; then what=$(nginx -v 2>&1); else what=$("$exe" --version); fi
echo "$what: $done_n requests measured; $total instructions; $((total / done_n)) per request"
echo "dump: $dump"
echo
per_request() { # callgrind_annotate options: its top functions, per request
  callgrind_annotate "$@" --threshold=100 "$dump" 2>/dev/null | python3 -c "
import re, sys
n = $done_n; k = 0
for line in sys.stdin:
    m = re.match(r'\s*([\d,]+) \([ \d.]+%\)\s+(.*)', line)
    if not m or 'PROGRAM TOTALS' in line: continue
    print(f'{int(m.group(1).replace(\",\", \"\")) / n:10.0f}  {m.group(2)[:160]}')
    k += 1
    if k >= $top: break
sys.stdin.read()  # the rest unread would end callgrind_annotate with SIGPIPE"
}
echo "## inclusive, per request"
per_request --inclusive=yes
echo
echo "## self, per request"
per_request
