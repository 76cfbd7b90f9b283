#!/usr/bin/env bash
# Gateway CPU per request at a fixed rate, user and system apart: tailguard against nginx
# (one worker), and optionally against another tailguard build, rounds interleaved (issue 25;
# the method of lab/compare-builds.sh with nginx as a gateway of its own).
#
# Topology (2 cores): the gateway under test has one serving thread (nginx: one worker)
# pinned to core 1; `tailguard load` (open loop, $CONNECTIONS keep-alive connections) and
# the upstream (nginx, one worker, a fixed 13-byte body) share core 0. tailguard runs with
# metrics on (recorded per request; the exporter on a free port, never scraped here); the
# access log is off for both unless ACCESS_LOG=1 (then both write one line per request to a
# file: tailguard `combined`, nginx `combined`). Each run: a fresh gateway process, $WARMUP
# at $RATE req/s, then $DURATION measured; the serving process's utime and stime
# (/proc/PID/stat) over the measured part divided by the requests completed in it. Each
# round runs every gateway once, the order rotating; printed: every round's user, system
# and total µs per request per gateway, the ratios to nginx per round, and the medians.
#   RATE=15000 ROUNDS=6 [A=old/tailguard] [ACCESS_LOG=1] [EXTRA_CONFIG=file] lab/compare-cpu.sh
# EXTRA_CONFIG=file appends that TOML to both tailguard builds' config (e.g. a `[tracing]`
# table, to compare what two builds' tracers cost against the same collector).
# Every process runs at nice $NICE (default -10, when root). Raw outputs go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
a=${A:-}
rate=${RATE:-15000}
dur=${DURATION:-15}
warm=${WARMUP:-3}
rounds=${ROUNDS:-6}
conns=${CONNECTIONS:-32}
access_log=${ACCESS_LOG:-0}
out=${OUT:-$(mktemp -d /tmp/compare-cpu.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "compare-cpu: $tool is not installed" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "compare-cpu: needs 2 cores" >&2; exit 1; }
for exe in "$b" ${a:+"$a"}; do [ -x "$exe" ] || { echo "compare-cpu: $exe is not executable" >&2; exit 1; }; done
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT

start_origin 0

{ proxy_config; extra_config; } > "$out/gateway.toml"
nginx_log="access_log off;"
tg_log=()
if [ "$access_log" = 1 ]; then
  nginx_log="access_log $out/nginx-access.log combined;"
  tg_log=(--access-log "$out/tailguard-access.log" --access-log-format combined)
fi
start_gateway() { # name -> sets gw_pid (the process whose CPU counts), stop_pid, gw_port
  gw_port=$(free_port)
  case $1 in
    nginx)
      sed -e "s|@DIR@|$out|g" -e "s|@LISTEN@|127.0.0.1:$gw_port|g" -e "s|@UPSTREAM@|127.0.0.1:$up_port|g" \
        -e "s|access_log off;|$nginx_log|" lab/nginx/proxy.conf > "$out/nginx.conf"
      "${prio[@]}" taskset -c 1 nginx -c "$out/nginx.conf" -p "$out" -e "$out/nginx-error.log" >> "$out/nginx.log" 2>&1 &
      stop_pid=$!
      pids+=("$stop_pid")
      wait_port "$gw_port"
      gw_pid=$(pgrep -P "$stop_pid" | head -1)
      ;;
    *)
      local exe=$b
      [ "$1" = baseline ] && exe=$a
      "${prio[@]}" taskset -c 1 "$exe" run --config "$out/gateway.toml" --threads 1 \
        --listen "127.0.0.1:$gw_port" --metrics-listen 127.0.0.1:0 "${tg_log[@]}" >> "$out/gateway.log" 2>&1 &
      gw_pid=$!
      stop_pid=$gw_pid
      pids+=("$gw_pid")
      wait_port "$gw_port"
      ;;
  esac
}
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "tailguard: $b ($("$b" --version))"
  [ -n "$a" ] && echo "baseline: $a ($("$a" --version))"
  nginx -v 2>&1
} > "$out/machine.txt"

ticks=$(getconf CLK_TCK)
cpu_of() { awk '{print $14, $15}' "/proc/$1/stat"; }
run_one() { # name round -> "user_us system_us requests"
  local name=$1 r=$2
  start_gateway "$name"
  "${prio[@]}" "$b" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${warm}s" \
    --connections "$conns" --pin 0 --brief > /dev/null 2>&1
  local before after
  before=$(cpu_of "$gw_pid")
  "${prio[@]}" "$b" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${dur}s" \
    --connections "$conns" --pin 0 --brief --json "$out/load-$name-$r.json" > "$out/load-$name-$r.txt" 2>&1
  after=$(cpu_of "$gw_pid")
  kill "$stop_pid"; wait "$stop_pid" 2>/dev/null || true
  python3 - "$before" "$after" "$ticks" "$out/load-$name-$r.json" <<'PY'
import json, sys
b = [int(x) for x in sys.argv[1].split()]
a = [int(x) for x in sys.argv[2].split()]
tck = int(sys.argv[3])
rep = json.load(open(sys.argv[4]))
done = rep["completed"]
print(f"{(a[0]-b[0])*1e6/tck/done:.3f} {(a[1]-b[1])*1e6/tck/done:.3f} {done}")
PY
}

gateways=(nginx tailguard)
[ -n "$a" ] && gateways+=(baseline)
: > "$out/rounds.txt"
for r in $(seq "$rounds"); do
  k=${#gateways[@]}
  for i in $(seq 0 $((k - 1))); do
    name=${gateways[$(( (r - 1 + i) % k ))]}
    echo "== round $r: $name" >&2
    echo "$r $name $(run_one "$name" "$r")" >> "$out/rounds.txt"
  done
done

python3 - "$out/rounds.txt" "$rate" "$dur" "$access_log" <<'PY' | tee "$out/summary.txt"
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r, name, user, system, done = line.split()
    rows.setdefault(int(r), {})[name] = (float(user), float(system), int(done))
print(open(sys.argv[1].replace("rounds.txt", "machine.txt")).read().rstrip())
log = "on (combined, to a file)" if sys.argv[4] == "1" else "off"
print(f"CPU per request (µs) of the serving process, {sys.argv[2]} req/s, {sys.argv[3]} s measured per run; access log {log}")
names = [n for n in ("nginx", "tailguard", "baseline") if n in rows[min(rows)]]
print("round  " + "  ".join(f"{n + ' user':>14} {'sys':>6} {'total':>6}" for n in names) + "   tg/nginx user  total" + ("   tg/baseline total" if "baseline" in names else ""))
cols = {k: [] for k in ("user", "total", "base")}
def ratio(a, b):
    """a / b; NaN when a short run sampled no tick at all (unknown, not a crash)."""
    return a / b if b > 0 else float("nan")
def known_median(xs):
    """The median of the ratios that are known (NaN: a round with no tick sampled)."""
    known = [x for x in xs if x == x]
    return statistics.median(known) if known else float("nan")
per = {n: [] for n in names}
for r in sorted(rows):
    line = f"{r:>5}  "
    for n in names:
        u, s, _ = rows[r][n]
        per[n].append((u, s, u + s))
        line += f"{u:>14.2f} {s:>6.2f} {u + s:>6.2f}  "
    t, g = rows[r]["tailguard"], rows[r]["nginx"]
    cols["user"].append(ratio(t[0], g[0])); cols["total"].append(ratio(t[0] + t[1], g[0] + g[1]))
    line += f" {cols['user'][-1]:>13.3f} {cols['total'][-1]:>6.3f}"
    if "baseline" in names:
        bl = rows[r]["baseline"]
        cols["base"].append(ratio(t[0] + t[1], bl[0] + bl[1]))
        line += f"   {cols['base'][-1]:>17.3f}"
    print(line)
print("median " + "  ".join(f"{statistics.median(x[0] for x in per[n]):>14.2f} {statistics.median(x[1] for x in per[n]):>6.2f} {statistics.median(x[2] for x in per[n]):>6.2f}" for n in names)
      + f"   {known_median(cols['user']):>13.3f} {known_median(cols['total']):>6.3f}"
      + (f"   {known_median(cols['base']):>17.3f}" if cols["base"] else ""))
PY
echo "raw: $out"
