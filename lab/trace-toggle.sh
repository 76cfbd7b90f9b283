#!/usr/bin/env bash
# What tracing costs a request, paired in time: one gateway process under one constant load,
# its `[tracing]` table switched on and off by reload (SIGHUP) every window, and the process's
# CPU time (every thread's, the exporter's included: the sum of /proc/PID/task/*/schedstat,
# in nanoseconds) read over each window. Each pair of adjacent windows, one on and one off
# (the order alternating), gives one ratio, so what the host does over minutes (steal,
# another tenant, a slower or faster phase) falls on both sides of it. Separate runs per
# condition (lab/compare-trace.sh cpu) vary +-10 % between rounds on this host, more than
# the +3 % the tracer may cost; the sampled share (PROFILE=1 lab/syscalls.sh with
# lab/tracer-split.py) counts only the tracer's own code, not what it costs the rest of the
# request (the `traceparent` line the upstream reads, the larger record, the caches).
#
# Topology as in lab/syscalls.sh: the gateway (one serving thread) alone on core 1;
# `tailguard load` ($CONNECTIONS connections, open loop at $RATE req/s), the nginx origin and
# the OTLP sink (lab/lib.sh `start_otlp_sink`: it ingests every span) on core 0. "On" is the
# sink's `[tracing]` table ($TRACE_RATIO, default every request; $TRACE_QUEUE, $TRACE_BATCH:
# lab/lib.sh `extra_config`); "off" is the same config without it. $SETTLE s after each
# reload (the exporter sends what the last window recorded within its 1 s batch interval),
# then $WINDOW s measured; $PAIRS pairs. The gateway, the origin and the sink at nice -10 when
# root; the load generator at its own priority, as in lab/syscalls.sh.
#
#   [B=target/release/tailguard] [RATE=15000] [PAIRS=20] [WINDOW=4] [SETTLE=2] \
#   [TRACE_RATIO=1.0] lab/trace-toggle.sh
# AA=1 makes "on" the same config as "off" (tracing off in both, reloaded alike): what the
# method reads when there is nothing to find.
# Prints each pair (CPU per request off and on, in microseconds, on/off, and the host's steal
# from core 1 in each window), then the median, mean, spread and pooled ratio; writes them to
# $OUT/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
rate=${RATE:-15000}
conns=${CONNECTIONS:-32}
pairs=${PAIRS:-20}
window=${WINDOW:-4}
settle=${SETTLE:-2}
out=${OUT:-$(mktemp -d /tmp/trace-toggle.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "trace-toggle: $tool is not installed" >&2; exit 1; }
done
prio=()
if [ "$(id -u)" = 0 ]; then prio=(nice -n -10); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
start_origin 0
start_otlp_sink 0
proxy_config > "$out/off.toml"
if [ "${AA:-0}" = 1 ]; then
  # The instrument checked against itself: "on" is "off" too, reloaded the same way.
  cp "$out/off.toml" "$out/on.toml"
else
  { proxy_config; TRACE_SINK=1 extra_config; } > "$out/on.toml"
fi
cp "$out/on.toml" "$out/gateway.toml"
start_tailguard "$b"

# The process's CPU time so far, ns: every live thread's (none comes or goes while serving).
cpu_ns() { cat /proc/"$gw_pid"/task/*/schedstat | awk '{ s += $1 } END { printf "%.0f\n", s }'; }
now_ns() { date +%s%N; }
# Core 1's steal time so far, in USER_HZ ticks (10 ms): what the host took from the VM's core.
steal_ticks() { awk '$1 == "cpu1" { print $9 }' /proc/stat; }

total=$((3 + pairs * 2 * (settle + window) + 5))
"$b" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${total}s" --warmup 2s \
  --connections "$conns" --pin 0 --brief --json "$out/load.json" > "$out/load.txt" 2>&1 &
load=$!
pids+=("$load")
sleep 3
: > "$out/windows.txt"
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) = 1 ]; then order="on off"; else order="off on"; fi
  for state in $order; do
    cp "$out/$state.toml" "$out/gateway.toml"
    kill -HUP "$gw_pid"
    sleep "$settle"
    c0=$(cpu_ns); t0=$(now_ns); s0=$(steal_ticks)
    sleep "$window"
    c1=$(cpu_ns); t1=$(now_ns); s1=$(steal_ticks)
    echo "$i $state $((c1 - c0)) $((t1 - t0)) $((s1 - s0))" >> "$out/windows.txt"
  done
done
wait "$load"
counters=$(trace_counters)
echo "$counters" > "$out/trace-counters.txt"
reloads=$(grep -c 'reloaded' "$out/gateway.log" || true)
python3 - "$out/windows.txt" "$rate" "$out/load.json" <<'PY' | tee "$out/summary.txt"
import json, statistics, sys
path, rate = sys.argv[1], float(sys.argv[2])
load = json.load(open(sys.argv[3]))
per = {}
for line in open(path):
    i, state, cpu, wall, steal = line.split()
    # CPU ns per request: the load is open loop at `rate`, so a window of `wall` ns carries
    # rate * wall requests (the load's report below says whether it kept the rate).
    per.setdefault(int(i), {})[state] = (int(cpu), int(cpu) / (rate * int(wall) / 1e9),
                                         int(steal) * 10)
ratios = []
print("pair  off us/req  on us/req  on/off  core 1 steal ms (off, on)")
for i in sorted(per):
    off, on = per[i]["off"][1], per[i]["on"][1]
    ratios.append(on / off)
    print(f"{i:4d}  {off / 1000:10.2f}  {on / 1000:9.2f}  {on / off:.4f}  "
          f"{per[i]['off'][2]}, {per[i]['on'][2]}")
pooled = sum(p["on"][0] for p in per.values()) / sum(p["off"][0] for p in per.values())
s = sorted(ratios)
print(f"on/off: median {statistics.median(s):.4f}, mean {statistics.mean(s):.4f}, "
      f"quartiles {s[len(s) // 4]:.4f}-{s[(3 * len(s)) // 4]:.4f}, min {s[0]:.4f}, "
      f"max {s[-1]:.4f}, pooled {pooled:.4f} ({len(s)} pairs)")
print("load:", {k: load[k] for k in ("requested_rate", "achieved_rate", "sent", "completed",
                                      "errors")})
PY
echo "trace counters: $counters"
echo "reloads logged: $reloads (of $((pairs * 2)) sent); raw: $out"
