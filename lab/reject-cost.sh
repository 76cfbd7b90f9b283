#!/usr/bin/env bash
# The CPU a rejection costs the gateway, measured: one serving thread pinned to core 1, an
# upstream that serves one request at a time for 20 ms (50 req/s), and an open-loop load of
# $RATE req/s (default 5000, 100x its capacity) from core 0, so ~99 % of requests are refused
# by the upstream's concurrency limit. The gateway's user + system CPU time
# (/proc/PID/stat) over the measured window divided by the requests in it is an upper bound
# on a rejection's cost (the ~1 % admitted and proxied cost more). Target: <= 20 us.
#   RATE=5000 DURATION=20s lab/reject-cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${RATE:-5000}
dur=${DURATION:-20s}
exe=${TAILGUARD:-target/release/tailguard}
[ -x "$exe" ] || cargo build --release -q -p tailguard
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up=$(free_port); gw=$(free_port); mx=$(free_port)
dir=$(mktemp -d /tmp/reject-cost.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
taskset -c 0 "$exe" upstream --listen "127.0.0.1:$up" --workers 1 --delay-ms 20 --threads 1 \
  >"$dir/upstream.log" 2>&1 &
pids+=($!)
cat >"$dir/gw.toml" <<TOML
[[listeners]]
address = "127.0.0.1:$gw"

[[upstreams]]
name = "slow"
endpoints = [{ address = "127.0.0.1:$up" }]

[[routes]]
id = "slow"
upstream = "slow"

[metrics]
listen = "127.0.0.1:$mx"

[overload]
mode = "adaptive"
TOML
taskset -c 1 "$exe" run --config "$dir/gw.toml" --threads 1 >"$dir/gateway.log" 2>&1 &
gw_pid=$!
pids+=($gw_pid)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$gw/healthz" && break; sleep 0.1; done
cpu() { awk '{print $14 + $15}' "/proc/$gw_pid/stat"; }
user() { awk '{print $14}' "/proc/$gw_pid/stat"; }
metric() { curl -s "http://127.0.0.1:$mx/metrics" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {print s + 0}'; }
# Warm up (the limit learns the upstream), then measure.
"$exe" load "http://127.0.0.1:$gw/" --rate "$rate" --duration 5s --connections 64 --pin 0 --brief >/dev/null
refused() { echo $(( $(metric 'tailguard_upstream_limited_total{upstream="slow"') + $(metric 'tailguard_overload_shed_total{group="slow"') )); }
cpu0=$(cpu); user0=$(user); lim0=$(refused); t0=$(date +%s.%N)
"$exe" load "http://127.0.0.1:$gw/" --rate "$rate" --duration "$dur" --connections 64 --pin 0 --brief \
  --json "$dir/load.json" | tee "$dir/load.txt" | grep -E "Requests/sec|Status|503|200" || true
cpu1=$(cpu); user1=$(user); lim1=$(refused); t1=$(date +%s.%N)
echo "refused by the upstream limit: $(metric 'tailguard_upstream_limited_total{upstream="slow"'), by the shedder: $(metric 'tailguard_overload_shed_total{group="slow"') (totals since start)"
ticks=$(getconf CLK_TCK)
python3 - "$cpu0" "$cpu1" "$lim0" "$lim1" "$ticks" "$dir/load.json" "$t0" "$t1" <<'PY'
import json, sys
cpu0, cpu1, lim0, lim1, ticks = (float(x) for x in sys.argv[1:6])
report = json.load(open(sys.argv[6]))
t0, t1 = float(sys.argv[7]), float(sys.argv[8])
total = report["completed"]
cpu_s = (cpu1 - cpu0) / ticks
limited = lim1 - lim0
print(f"window {t1 - t0:.1f} s: gateway CPU {cpu_s:.2f} s, refused {limited:.0f}, responses {total}")
if total:
    print(f"gateway CPU per request (upper bound on a rejection's cost): {cpu_s / total * 1e6:.2f} us")
if limited:
    print(f"gateway CPU per rejected request (all CPU charged to rejections): {cpu_s / limited * 1e6:.2f} us")
PY
echo "of which user: $(( (user1 - user0) * 100 / (cpu1 - cpu0 > 0 ? cpu1 - cpu0 : 1) )) % (the rest is the kernel: loopback TCP is delivered within the sender's syscalls)"
echo "raw: $dir"
