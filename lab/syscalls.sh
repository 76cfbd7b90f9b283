#!/usr/bin/env bash
# The kernel's share per request, counted: system calls by kind, context switches and
# softirqs of the serving process per proxied request, tailguard against nginx (issue 25's
# "fewer wake-ups and epoll_wait calls"). Counted with `perf stat` on the syscall and
# scheduler tracepoints (they need no hardware counters), over $WINDOW s in the middle of a
# $RATE req/s run, in the topology of lab/compare-cpu.sh: the gateway (one serving thread;
# nginx one worker) on core 1, `tailguard load` ($CONNECTIONS connections) and the nginx
# origin on core 0. Counts do not depend on the machine being quiet; rates do a little
# (a busier loop finds more ready events per `epoll_wait`).
# EXTRA_CONFIG=file appends that TOML to the gateway's config (e.g. a `[tracing]` table);
# TRACE_SINK=1 appends a `[tracing]` table exporting every span ($TRACE_RATIO) to an OTLP
# sink on core 0 that ingests all of them (lab/lib.sh `start_otlp_sink`). A traced run prints
# the gateway's trace counters: a share measured while spans were dropped (`queue_full`: the
# collector could not keep up) is not the cost of exporting them all.
# PROFILE=1 samples core 1 instead (`perf record -g -e cpu-clock`, kernel and user, the
# softirqs included whatever context they run in) and sorts each sample by its call chain into
# what the serving core's busy time goes to (lab/kernel-split.py): user space, entering and
# leaving system calls, epoll_wait, wake-ups, the scheduler, the TCP/IP stack. That split
# bounds what io_uring could save before trying it (issue 25): it merges entries, exits and
# the waits, not the stack's work.
#   RATE=15000 [B=target/release/tailguard] [GATEWAYS="nginx tailguard"] [PROFILE=1] lab/syscalls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
rate=${RATE:-15000}
conns=${CONNECTIONS:-32}
window=${WINDOW:-5}
out=${OUT:-$(mktemp -d /tmp/syscalls.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx perf taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "syscalls: $tool is not installed" >&2; exit 1; }
done
prio=()
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
start_origin 0
if [ "${TRACE_SINK:-0}" = 1 ]; then start_otlp_sink 0; fi
{ proxy_config; extra_config; } > "$out/gateway.toml"
kinds='read|write|writev|readv|recvfrom|sendto|recvmsg|sendmsg|epoll_wait|epoll_pwait|epoll_pwait2|epoll_ctl|futex|sched_yield|accept4|close|io_uring_enter'
events=$(perf list 2>/dev/null | grep -oE "syscalls:sys_enter_($kinds)\b" | sort -u | paste -sd,)
[ -n "$events" ] || { echo "syscalls: perf lists no syscall tracepoints (needs root and tracefs)" >&2; exit 1; }
events="$events,raw_syscalls:sys_enter,sched:sched_switch,irq:softirq_entry"
for name in ${GATEWAYS:-nginx tailguard}; do
  gw_port=$(free_port)
  if [ "$name" = nginx ]; then
    sed -e "s|@DIR@|$out|g" -e "s|@LISTEN@|127.0.0.1:$gw_port|g" -e "s|@UPSTREAM@|127.0.0.1:$up_port|g" \
      lab/nginx/proxy.conf > "$out/nginx.conf"
    taskset -c 1 nginx -c "$out/nginx.conf" -p "$out" -e "$out/nginx-error.log" >> "$out/nginx.log" 2>&1 &
    stop_pid=$!
    pids+=("$stop_pid")
    wait_port "$gw_port"
    gw_pid=$(pgrep -P "$stop_pid" | head -1)
  else
    start_tailguard "$b"
    stop_pid=$gw_pid
  fi
  total=$((window + 3))
  "$b" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${total}s" --warmup 2s \
    --connections "$conns" --pin 0 --brief --json "$out/load-$name.json" > "$out/load-$name.txt" 2>&1 &
  load=$!
  sleep 3.5
  if [ "${PROFILE:-0}" = 1 ]; then
    perf record -q -g -e cpu-clock -F 20000 -C 1 -o "$out/perf-$name.data" -- sleep "$window" 2> "$out/perf-record-$name.txt"
  else
    perf stat -x, -e "$events" -p "$gw_pid" -- sleep "$window" 2> "$out/perf-$name.txt"
  fi
  wait "$load"
  counters=""
  if [ "$name" != nginx ]; then
    sleep 1 # the batch interval: what the last requests recorded is exported or dropped
    counters=$(trace_counters)
    echo "$counters" > "$out/trace-counters-$name.txt"
  fi
  kill "$stop_pid"; wait "$stop_pid" 2>/dev/null || true
  if [ "${PROFILE:-0}" = 1 ]; then
    perf script -i "$out/perf-$name.data" -F comm,ip,sym 2> /dev/null > "$out/stacks-$name.txt"
    python3 lab/kernel-split.py "$name" "$out/stacks-$name.txt"
    if [ -n "$counters" ]; then echo "  trace counters: $counters"; fi
    continue
  fi
  python3 - "$name" "$out/load-$name.json" "$out/perf-$name.txt" "$window" <<'PY'
import json, sys
name, load, perf, window = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rep = json.load(open(load))
per_second = rep["achieved_rate"]
requests = per_second * window
print(f"== {name}: {per_second:.0f} req/s completed; per request over {window:.0f} s:")
for line in open(perf):
    fields = line.strip().split(",")
    if len(fields) < 3 or not fields[0].replace(".", "").isdigit():
        continue
    count, event = float(fields[0]), fields[2]
    if count > 0:
        print(f"  {event.replace('syscalls:sys_enter_', ''):<24} {count / requests:8.3f}")
PY
done | tee "$out/summary.txt"
echo "raw: $out"
