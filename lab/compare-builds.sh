#!/usr/bin/env bash
# Gateway CPU per request of two tailguard builds at a fixed rate, rounds interleaved: what a
# change costs on the request path, measured the way issues 23 and 25 ask.
#
# Topology (2 cores): the gateway under test runs one serving thread pinned to core 1, with
# metrics on and no access log; `tailguard load` (open loop, $CONNECTIONS keep-alive
# connections) and the upstream (nginx, one worker, a fixed 13-byte body) share core 0. Each
# run: $WARMUP at $RATE req/s, then $DURATION measured; the gateway's utime + stime
# (/proc/PID/stat) over the measured part divided by the requests completed in it is its CPU
# per request. Each round runs A and B once, the order alternating (ABBA...), $ROUNDS rounds;
# printed: both figures per round (user and system apart), the ratio B/A per round, and the
# median ratio.
#   A=old/tailguard B=target/release/tailguard RATE=15000 ROUNDS=6 lab/compare-builds.sh
# Every process runs at nice $NICE (default -10, when root) so builds beside it on a shared
# machine take CPU from neither build. Raw outputs go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
a=${A:?A=<baseline tailguard binary>}
b=${B:-target/release/tailguard}
rate=${RATE:-15000}
dur=${DURATION:-15}
warm=${WARMUP:-3}
rounds=${ROUNDS:-6}
conns=${CONNECTIONS:-32}
out=${OUT:-$(mktemp -d /tmp/compare-builds.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "compare-builds: $tool is not installed" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "compare-builds: needs 2 cores" >&2; exit 1; }
for exe in "$a" "$b"; do [ -x "$exe" ] || { echo "compare-builds: $exe is not executable" >&2; exit 1; }; done
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT

start_origin 0

proxy_config > "$out/gateway.toml"
# A fresh gateway process for every run (started, warmed up, measured, stopped): one
# process kept across rounds carries its own layout and placement into every round, and an
# A/A run of one binary against itself showed 0.85-0.99 that way.
start_gateway() { # exe -> sets gw_pid, gw_port
  gw_port=$(free_port)
  # Metrics on (recorded per request; the exporter on a free port, never scraped here).
  "${prio[@]}" taskset -c 1 "$1" run --config "$out/gateway.toml" --threads 1 \
    --listen "127.0.0.1:$gw_port" --metrics-listen 127.0.0.1:0 >> "$out/gateway.log" 2>&1 &
  gw_pid=$!
  pids+=("$gw_pid")
  wait_port "$gw_port"
}
"$b" --version > "$out/versions.txt" 2>&1 || true
"$a" --version >> "$out/versions.txt" 2>&1 || true

ticks=$(getconf CLK_TCK)
cpu_of() { awk '{print $14, $15}' "/proc/$1/stat"; }
run_one() { # name round -> "user_us system_us requests"
  local name=$1 r=$2 exe=$a
  [ "$name" = B ] && exe=$b
  start_gateway "$exe"
  "${prio[@]}" "$b" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${warm}s" \
    --connections "$conns" --pin 0 --brief > /dev/null 2>&1
  local before after
  before=$(cpu_of "$gw_pid")
  "${prio[@]}" "$b" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${dur}s" \
    --connections "$conns" --pin 0 --brief --json "$out/load-$name-$r.json" > "$out/load-$name-$r.txt" 2>&1
  after=$(cpu_of "$gw_pid")
  kill "$gw_pid"; wait "$gw_pid" 2>/dev/null || true
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

: > "$out/rounds.txt"
for r in $(seq "$rounds"); do
  order=(A B); [ $((r % 2)) -eq 0 ] && order=(B A)
  for name in "${order[@]}"; do
    echo "$r $name $(run_one "$name" "$r")" >> "$out/rounds.txt"
  done
done

python3 - "$out/rounds.txt" "$rate" "$dur" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r, name, user, system, done = line.split()
    rows.setdefault(int(r), {})[name] = (float(user), float(system), int(done))
print(f"CPU per request (us), {sys.argv[2]} req/s, {sys.argv[3]} s measured per run; A = baseline, B = candidate")
print("round   A user  A sys  A total   B user  B sys  B total   B/A")
ratios = []
for r in sorted(rows):
    au, asy, _ = rows[r]["A"]; bu, bsy, _ = rows[r]["B"]
    ratio = (bu + bsy) / (au + asy)
    ratios.append(ratio)
    print(f"{r:>5}  {au:7.2f} {asy:6.2f} {au+asy:8.2f}  {bu:7.2f} {bsy:6.2f} {bu+bsy:8.2f}  {ratio:.3f}")
print(f"median B/A: {statistics.median(ratios):.3f}  (rounds: {', '.join(f'{x:.3f}' for x in ratios)})")
PY
echo "raw: $out"
