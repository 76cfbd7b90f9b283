#!/usr/bin/env bash
# What the status page (issue 48) costs the requests: CPU per request and latency at a fixed
# rate on one serving thread, with the page open in a browser polling every second against
# the same gateway without it, rounds interleaved, a fresh gateway process for every run
# (the method of lab/compare-cpu.sh).
#
# Conditions:
#   off      `[status] enabled = false`: no page, no tick
#   idle     the default: the page's tick runs every second on the exporter thread, nobody
#            looks
#   fetched  the default, and /status.json fetched every second by curl: what the gateway
#            serves a page that is open somewhere else (an operator's browser), without the
#            browser's drawing on this machine
#   polled   the default, and a headless Chromium (Debian's chromium) has /status open: the
#            page fetches /status.json every second and draws it
# Topology (2 cores): the gateway (one serving thread, its exporter thread at its default
# SCHED_IDLE) pinned to core 1; `tailguard load` (open loop, $CONNECTIONS keep-alive
# connections), the upstream (nginx, one worker, a 13-byte body) and Chromium share core 0.
# Each run: $WARMUP at $RATE req/s, then $DURATION measured; CPU per request is the gateway
# process's utime + stime (/proc/PID/stat, every thread: the exporter's work on the page is
# counted) over the measured part divided by the requests completed in it; latency from the
# load's HdrHistogram (P50, P99, P99.9, P100). Every process runs at nice $NICE (default
# -10, when root) but Chromium, at nice 19. Raw outputs go to $OUT; summary.txt there has every round.
#   RATE=15000 ROUNDS=6 DURATION=15 lab/compare-status.sh
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
rate=${RATE:-15000}
dur=${DURATION:-15}
warm=${WARMUP:-3}
rounds=${ROUNDS:-6}
conns=${CONNECTIONS:-32}
out=${OUT:-$(mktemp -d /tmp/compare-status.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl chromium; do
  command -v "$tool" >/dev/null || { echo "compare-status: $tool is not installed" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "compare-status: needs 2 cores" >&2; exit 1; }
[ -x "$b" ] || { echo "compare-status: $b is not executable" >&2; exit 1; }
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
wait_metrics() { # port: returns once the exporter answers /metrics (30 s at most)
  for _ in $(seq 600); do curl -fs -o /dev/null "http://127.0.0.1:$1/metrics" && return 0; sleep 0.05; done
  echo "$(basename "$0"): no exporter on port $1" >&2
  exit 1
}

start_origin 0
proxy_config > "$out/on.toml"
{ proxy_config; printf '\n[status]\nenabled = false\n'; } > "$out/off.toml"
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "tailguard: $b ($("$b" --version))"
  chromium --version 2>/dev/null || true
} > "$out/machine.txt"

ticks=$(getconf CLK_TCK)
cpu_of() { awk '{print $14, $15}' "/proc/$1/stat"; }
run_one() { # condition round -> "user_us system_us requests"
  local kind=$1 r=$2 config=$out/on.toml browser_pid=""
  [ "$kind" = off ] && config=$out/off.toml
  local gw_port metrics_port
  gw_port=$(free_port)
  metrics_port=$(free_port)
  "${prio[@]}" taskset -c 1 "$b" run --config "$config" --threads 1 --listen "127.0.0.1:$gw_port" \
    --metrics-listen "127.0.0.1:$metrics_port" >> "$out/gateway.log" 2>&1 &
  local gw_pid=$!
  pids+=("$gw_pid")
  wait_port "$gw_port"
  wait_metrics "$metrics_port"
  if [ "$kind" = fetched ]; then
    nice -n 19 taskset -c 0 bash -c "while sleep 1; do curl -s -o /dev/null http://127.0.0.1:$metrics_port/status.json; done" &
    browser_pid=$!
    pids+=("$browser_pid")
  fi
  if [ "$kind" = polled ]; then
    local profile
    profile=$(mktemp -d "$out/chromium.XXXXXX")
    # --remote-debugging-port keeps a headless Chromium running with the page open.
    # At nice 19: the browser stands for an operator's, which runs elsewhere; here it shares
    # core 0 with the load generator and the origin, and must not delay them (at their
    # priority its drawing every second stalled the load by hundreds of milliseconds, which
    # the gateway's latency then showed). What the gateway pays is the same either way: the
    # page's fetch of /status.json every second.
    nice -n 19 taskset -c 0 chromium --headless --no-sandbox --disable-gpu --disable-quic \
      --no-first-run --disable-background-networking --disable-component-update --disable-sync \
      --user-data-dir="$profile" --remote-debugging-port=0 \
      "http://127.0.0.1:$metrics_port/status" >> "$out/chromium.log" 2>&1 &
    browser_pid=$!
    pids+=("$browser_pid")
  fi
  "${prio[@]}" "$b" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${warm}s" \
    --connections "$conns" --pin 0 --brief > /dev/null 2>&1
  local before after
  before=$(cpu_of "$gw_pid")
  "${prio[@]}" "$b" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${dur}s" \
    --connections "$conns" --pin 0 --brief --json "$out/load-$kind-$r.json" \
    --hgrm "$out/load-$kind-$r.hgrm" > "$out/load-$kind-$r.txt" 2>&1
  after=$(cpu_of "$gw_pid")
  # The document the page was drawing, for the record.
  if [ -n "$browser_pid" ] && [ "$kind" = fetched ]; then
    kill "$browser_pid" 2>/dev/null || true
    wait "$browser_pid" 2>/dev/null || true
  elif [ -n "$browser_pid" ]; then
    curl -s "http://127.0.0.1:$metrics_port/status.json" -o "$out/status-$r.json" || true
    kill "$browser_pid" 2>/dev/null || true
    wait "$browser_pid" 2>/dev/null || true
    rm -rf "$profile"
  fi
  kill "$gw_pid"; wait "$gw_pid" 2>/dev/null || true
  python3 - "$before" "$after" "$ticks" "$out/load-$kind-$r.json" <<'PY'
import json, sys
b = [int(x) for x in sys.argv[1].split()]
a = [int(x) for x in sys.argv[2].split()]
tck = int(sys.argv[3])
rep = json.load(open(sys.argv[4]))
done = rep["completed"]
print(f"{(a[0]-b[0])*1e6/tck/done:.3f} {(a[1]-b[1])*1e6/tck/done:.3f} {done}")
PY
}

kinds=(off idle fetched polled)
: > "$out/rounds.txt"
for r in $(seq "$rounds"); do
  k=${#kinds[@]}
  for i in $(seq 0 $((k - 1))); do
    kind=${kinds[$(( (r - 1 + i) % k ))]}
    echo "== round $r: $kind" >&2
    echo "$r $kind $(run_one "$kind" "$r")" >> "$out/rounds.txt"
  done
done

python3 - "$out" "$rate" "$dur" <<'PY' | tee "$out/summary.txt"
import statistics, sys
out, rate, dur = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, "lab")  # lab/hgrm.py (the scripts run from the repository's root)
from hgrm import hgrm
rows = {}
for line in open(f"{out}/rounds.txt"):
    r, kind, user, system, done = line.split()
    rows.setdefault(int(r), {})[kind] = (float(user), float(system), int(done), hgrm(f"{out}/load-{kind}-{r}.hgrm"))
print(open(f"{out}/machine.txt").read().rstrip())
print(f"gateway CPU per request (µs, user+sys) and latency (ms), {rate} req/s on one serving thread, {dur} s measured per run")
kinds = ["off", "idle", "fetched", "polled"]
print("round " + "".join(f"| {k:>7} cpu  P50    P99   P99.9  P100 " for k in kinds) + "| fetched/idle cpu  P99 | polled/idle cpu  P99 | polled/off cpu  P99")
ratios = {"fi_cpu": [], "fi_p99": [], "pi_cpu": [], "pi_p99": [], "po_cpu": [], "po_p99": []}
for r in sorted(rows):
    line = f"{r:>5} "
    for k in kinds:
        u, s, _, (p50, p99, p999, p100) = rows[r][k]
        line += f"| {u + s:>11.2f} {p50:>5.2f} {p99:>6.2f} {p999:>6.2f} {p100:>6.2f} "
    cpu = {k: rows[r][k][0] + rows[r][k][1] for k in kinds}
    p99 = {k: rows[r][k][3][1] for k in kinds}
    ratios["fi_cpu"].append(cpu["fetched"] / cpu["idle"]); ratios["fi_p99"].append(p99["fetched"] / p99["idle"])
    ratios["pi_cpu"].append(cpu["polled"] / cpu["idle"]); ratios["pi_p99"].append(p99["polled"] / p99["idle"])
    ratios["po_cpu"].append(cpu["polled"] / cpu["off"]); ratios["po_p99"].append(p99["polled"] / p99["off"])
    line += f"| {ratios['fi_cpu'][-1]:>15.3f} {ratios['fi_p99'][-1]:>5.3f} "
    line += f"| {ratios['pi_cpu'][-1]:>14.3f} {ratios['pi_p99'][-1]:>5.3f} | {ratios['po_cpu'][-1]:>13.3f} {ratios['po_p99'][-1]:>5.3f}"
    print(line)
med = statistics.median
line = "median"
for k in kinds:
    vals = [rows[r][k] for r in rows]
    line += f"| {med(v[0] + v[1] for v in vals):>11.2f} {med(v[3][0] for v in vals):>5.2f} {med(v[3][1] for v in vals):>6.2f} {med(v[3][2] for v in vals):>6.2f} {med(v[3][3] for v in vals):>6.2f} "
line += f"| {med(ratios['fi_cpu']):>15.3f} {med(ratios['fi_p99']):>5.3f} "
line += f"| {med(ratios['pi_cpu']):>14.3f} {med(ratios['pi_p99']):>5.3f} | {med(ratios['po_cpu']):>13.3f} {med(ratios['po_p99']):>5.3f}"
print(line)
PY
echo "raw: $out"
