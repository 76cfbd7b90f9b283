#!/usr/bin/env bash
# Page faults (minor) and context switches per thread of the gateway over $WINDOW s in the
# middle of a $RATE req/s run, in the topology of lab/compare-cpu.sh (the gateway with one serving thread on core 1;
# `tailguard load` and the nginx origin on core 0): from each thread's minflt in
# /proc/PID/task/TID/stat, and its voluntary and involuntary switches in .../status. A thread
# that keeps faulting in the steady state is allocating fresh memory (or having it returned to
# the kernel and mapped again), which shows up as kernel time in its CPU; a thread woken often
# pays the scheduler, and so does the thread that wakes it. EXTRA_CONFIG=file appends that TOML to the gateway's config (e.g. a
# `[tracing]` table, with a collector listening where it points).
#   RATE=15000 [WINDOW=5] [B=target/release/tailguard] [EXTRA_CONFIG=file] lab/thread-faults.sh
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
rate=${RATE:-15000}
window=${WINDOW:-5}
conns=${CONNECTIONS:-32}
out=${OUT:-$(mktemp -d /tmp/thread-faults.XXXXXX)}
mkdir -p "$out"
for tool in nginx taskset; do
  command -v "$tool" >/dev/null || { echo "thread-faults: $tool is not installed" >&2; exit 1; }
done
prio=()
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
start_origin 0
{ proxy_config; extra_config; } > "$out/gateway.toml"
start_tailguard "$b"
gw=$gw_pid
"$b" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "$((window + 3))s" --warmup 1s \
  --connections "$conns" --pin 0 --brief > "$out/load.txt" 2>&1 &
load=$!
sleep 2
faults() {
  for t in /proc/"$gw"/task/*; do
    echo "$(tr ' ' _ < "$t/comm") $(awk '{print $10}' "$t/stat")" \
      "$(awk '/ctxt_switches/ {n += $2} END {print n}' "$t/status")"
  done
}
faults > "$out/before"
sleep "$window"
faults > "$out/after"
wait "$load"
echo "per thread over $window s at $rate req/s:  minor faults  context switches"
paste "$out/before" "$out/after" |
  awk '$5 - $2 + $6 - $3 > 0 {printf "  %-20s %12d %17d\n", $1, $5 - $2, $6 - $3}'
