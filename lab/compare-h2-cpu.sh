#!/usr/bin/env bash
# Gateway CPU per HTTP/2 request of two tailguard builds at a fixed rate, rounds interleaved
# (issue 44 item 3: what freeing an idle connection's h2 buffers costs a busy one).
#
# h2c with prior knowledge from h2load (nghttp2-client) to the gateway, HTTP/1.1 from the
# gateway to the lab's origin (nginx, one worker, a fixed 13-byte body). h2load's `--rps`
# sends each of its $CONNECTIONS connections' requests at a fixed rate, one at a time: every
# request finds its connection idle (the worst case for the patch: each one frees and re-takes
# the read and the write buffer). Topology (2 cores): the gateway, one serving thread, alone
# on core 1; h2load and the origin share core 0. Each run: a fresh gateway process, $WARMUP s
# at the rate, then $DURATION s measured; the gateway's utime + stime (/proc/PID/stat) over
# the measured run divided by the requests that got a 2xx. Rounds ABBA...; printed: both
# figures per round (user and system apart), the ratio B/A per round, and the medians.
#   A=old/tailguard B=target/release/tailguard RATE=4000 ROUNDS=6 lab/compare-h2-cpu.sh
# Every process runs at nice $NICE (default -10, when root). Raw outputs go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
a=${A:?A=<baseline tailguard binary>}
b=${B:-target/release/tailguard}
rate=${RATE:-4000}
dur=${DURATION:-15}
warm=${WARMUP:-3}
rounds=${ROUNDS:-6}
conns=${CONNECTIONS:-16}
out=${OUT:-$(mktemp -d /tmp/compare-h2-cpu.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx h2load taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "compare-h2-cpu: $tool is not installed" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "compare-h2-cpu: needs 2 cores" >&2; exit 1; }
for exe in "$a" "$b"; do [ -x "$exe" ] || { echo "compare-h2-cpu: $exe is not executable" >&2; exit 1; }; done
[ $((rate % conns)) -eq 0 ] || { echo "compare-h2-cpu: RATE must be a multiple of CONNECTIONS" >&2; exit 1; }
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT

start_origin 0
proxy_config > "$out/gateway.toml"
start_gateway() { # exe -> sets gw_pid, gw_port
  gw_port=$(free_port)
  RUST_LOG=warn "${prio[@]}" taskset -c 1 "$1" run --config "$out/gateway.toml" --threads 1 \
    --listen "127.0.0.1:$gw_port" --metrics-listen 127.0.0.1:0 >> "$out/gateway.log" 2>&1 &
  gw_pid=$!
  pids+=("$gw_pid")
  wait_port "$gw_port"
}
load() { # seconds output
  "${prio[@]}" taskset -c 0 h2load "http://127.0.0.1:$gw_port/" -c "$conns" -m 1 \
    --rps $((rate / conns)) -D "$1" > "$2" 2>&1
}
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "A: $a ($("$a" --version)); B: $b ($("$b" --version)); $(h2load --version | head -1)"
} > "$out/machine.txt"

cpu_of() { awk '{print $14, $15}' "/proc/$1/stat"; }
: > "$out/rounds.txt"
for r in $(seq "$rounds"); do
  order=(A B); [ $((r % 2)) -eq 0 ] && order=(B A)
  for name in "${order[@]}"; do
    exe=$a; [ "$name" = B ] && exe=$b
    echo "== round $r: $name" >&2
    start_gateway "$exe"
    load "$warm" "$out/warm-$name-$r.txt"
    read -r u0 s0 < <(cpu_of "$gw_pid")
    load "$dur" "$out/h2load-$name-$r.txt"
    read -r u1 s1 < <(cpu_of "$gw_pid")
    kill "$gw_pid"; wait "$gw_pid" 2>/dev/null || true
    echo "$r $name $((u1 - u0)) $((s1 - s0))" >> "$out/rounds.txt"
  done
done

python3 - "$out" "$rate" "$dur" "$conns" <<'PY' | tee "$out/summary.txt"
import os, re, statistics, sys
out, rate, dur, conns = sys.argv[1:]
tck = os.sysconf("SC_CLK_TCK")
rows = {}
for line in open(f"{out}/rounds.txt"):
    r, name, user, system = line.split()
    text = open(f"{out}/h2load-{name}-{r}.txt").read()
    ok = int(re.search(r"status codes: (\d+) 2xx", text).group(1))
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", text).group(1)
    per = lambda t: int(t) / tck / max(ok, 1) * 1e6
    rows.setdefault(int(r), {})[name] = (per(user), per(system), ok, mean)
print(open(f"{out}/machine.txt").read().rstrip())
print(f"h2c GET at {rate} req/s (h2load --rps, {conns} connections, one stream at a time each), "
      f"{dur} s measured per run; gateway: 1 serving thread alone on core 1; CPU us per 2xx")
print("round   A user  A sys  A total   B user  B sys  B total   B/A    A 2xx / B 2xx     mean request time A / B")
ratios = []
for r in sorted(rows):
    au, asy, aok, am = rows[r]["A"]; bu, bsy, bok, bm = rows[r]["B"]
    ratio = (bu + bsy) / (au + asy)
    ratios.append(ratio)
    print(f"{r:>5}  {au:7.2f} {asy:6.2f} {au+asy:8.2f}  {bu:7.2f} {bsy:6.2f} {bu+bsy:8.2f}  {ratio:.3f}  {aok:>7}/{bok:<7}  {am} / {bm}")
med = lambda name: statistics.median(sum(rows[r][name][:2]) for r in rows)
print(f"median A {med('A'):.2f} us/request, B {med('B'):.2f} us/request; median B/A {statistics.median(ratios):.3f} "
      f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})")
PY
echo "raw: $out"
