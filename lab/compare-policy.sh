#!/usr/bin/env bash
# What a route's traffic policy costs: CPU (or instructions) per request of a route with a
# prefix rewrite, three request-header operations and a rate limit, against a plain route,
# both in one gateway process to one upstream.
#
# One gateway (one serving thread, pinned to core 0, no access log) serves two routes to the
# same upstream (`tailguard upstream`, 13-byte body, core 1):
#   /plain/...   nothing but the match
#   /policy/...  `rewrite = { prefix = "/v2" }`, `request_headers` add + set (`$route`) +
#                remove, and `rate_limit` keyed by client address, set high enough never to
#                refuse (so it pays the full check of every request, as a limited route does)
# MODE=cpu (default): `tailguard load` (open loop, core 1) sends $RATE req/s for $DURATION
#   to one route, then to the other, $ROUNDS times, the order alternating each round; the
#   gateway's CPU time (user + system, /proc) over each run divided by the requests sent is
#   that route's CPU per request. Printed: both per round, the ratio policy/plain per round,
#   and the median ratio. Noisy on a shared host, hence interleaved and a median.
# MODE=callgrind: the gateway runs under callgrind (valgrind); after a warm-up each route
#   gets wrk for $D seconds between a zero and a dump of the counters, so instructions per
#   request is exact and repeatable. The release binary runs under valgrind as it is (since
#   issue 22 rustix takes the aux vector from libc; before, a build with
#   RUSTFLAGS="--cfg rustix_use_libc" was needed).
# POLICY=cors makes the second route's policy a `cors` table alone (issue 51: a route with
#   `cors` against the same route without it); ORIGIN=https://app.example sends that `Origin`
#   with every request of both routes (an allowed origin for POLICY=cors), none by default.
# Every process runs at nice $NICE (default -10, when root). Raw outputs go to $OUT.
#   RATE=4000 DURATION=10s ROUNDS=5 lab/compare-policy.sh
#   MODE=callgrind D=5 lab/compare-policy.sh
#   MODE=callgrind D=5 POLICY=cors [ORIGIN=https://app.example] lab/compare-policy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${MODE:-cpu}
rate=${RATE:-4000}
dur=${DURATION:-10s}
rounds=${ROUNDS:-5}
policy=${POLICY:-headers}
origin=${ORIGIN:-}
out=${OUT:-$(mktemp -d /tmp/compare-policy.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ "$(nproc)" -ge 2 ] || { echo "compare-policy: needs 2 cores" >&2; exit 1; }
for tool in taskset curl python3; do
  command -v "$tool" >/dev/null || { echo "compare-policy: $tool is not installed" >&2; exit 1; }
done
if [ "$mode" = callgrind ]; then
  for tool in valgrind callgrind_control wrk; do
    command -v "$tool" >/dev/null || { echo "compare-policy: $tool is not installed" >&2; exit 1; }
  done
fi
exe=${TAILGUARD:-target/release/tailguard}
if [ -z "${TAILGUARD:-}" ]; then cargo build --release -q -p tailguard; fi

prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port); gw_port=$(free_port); metrics_port=$(free_port)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
wait_url() {
  for _ in $(seq 300); do
    if curl -sf -o /dev/null "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "compare-policy: nothing answers at $1" >&2; exit 1
}

"${prio[@]}" taskset -c 1 "$exe" upstream --listen "127.0.0.1:$up_port" --threads 1 --body-bytes 13 \
  > "$out/upstream.log" 2>&1 &
pids+=($!)

cat > "$out/gateway.toml" <<TOML
[[listeners]]
address = "127.0.0.1:$gw_port"

[metrics]
listen = "127.0.0.1:$metrics_port"

[[upstreams]]
name = "app"
endpoints = [{ address = "127.0.0.1:$up_port" }]

[[routes]]
id = "plain"
upstream = "app"
path = { prefix = "/plain" }

[[routes]]
id = "policy"
upstream = "app"
path = { prefix = "/policy" }
TOML
if [ "$policy" = cors ]; then
  cat >> "$out/gateway.toml" <<'TOML'
cors = { origins = ["https://app.example", "https://admin.example", "https://*.example.com"], methods = ["PUT", "DELETE"], headers = ["content-type", "x-token"], expose_headers = ["x-request-id"], credentials = true, max_age_s = 600 }
TOML
else
  cat >> "$out/gateway.toml" <<'TOML'
rewrite = { prefix = "/v2" }
rate_limit = { rate = 1000000000, burst = 1000000, key = "client_ip" }

[routes.request_headers]
add = [{ name = "x-tenant", value = "blue" }]
set = [{ name = "x-route", value = "$route" }]
remove = ["x-debug"]
TOML
fi
wrk_header=(); load_header=()
if [ -n "$origin" ]; then wrk_header=(-H "Origin: $origin"); load_header=(--header "Origin: $origin"); fi
"$exe" check --config "$out/gateway.toml" > /dev/null

gateway=("$exe" run --config "$out/gateway.toml" --threads 1)
if [ "$mode" = callgrind ]; then
  gateway=(valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$out/cg.out" "${gateway[@]}")
fi
RUST_LOG=warn "${prio[@]}" taskset -c 0 "${gateway[@]}" > "$out/gateway.log" 2>&1 &
gw_pid=$!
pids+=($!)
declare -A url=([plain]="http://127.0.0.1:$gw_port/plain/item?q=1" [policy]="http://127.0.0.1:$gw_port/policy/item?q=1")
for r in plain policy; do wait_url "${url[$r]}"; done
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "policy route: POLICY=$policy; Origin: ${origin:-none}"
  echo "$("$exe" --version); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$out/machine.txt"

if [ "$mode" = callgrind ]; then
  D=${D:-5}
  for r in plain policy; do taskset -c 1 wrk -t1 -c50 -d2s "${wrk_header[@]}" "${url[$r]}" > /dev/null; done
  : > "$out/callgrind.txt"
  objdump -d --no-show-raw-insn "$exe" \
    | awk '/^[0-9a-f]+ <.*>:$/{fn=$2} /\tlock |\txchg .*\(/{sub(":","",$1); print $1, fn}' > "$out/locks.txt"
  for r in plain policy; do
    callgrind_control -z "$gw_pid" > /dev/null
    taskset -c 1 wrk -t1 -c50 -d"${D}s" "${wrk_header[@]}" "${url[$r]}" > "$out/wrk-$r.txt"
    callgrind_control -d "$gw_pid" > /dev/null
    sleep 1
    n=$(awk '/requests in/{print $1}' "$out/wrk-$r.txt")
    dump=$(ls "$out"/cg.out.* | sort -V | tail -1)
    ir=$(awk '/^summary:|^totals:/{print $2; exit}' "$dump")
    echo "$r $n $ir" >> "$out/callgrind.txt"
    # The functions with the most instructions per request (self cost) and the atomics.
    python3 docs/benchmarks/2026-11-22-instructions/count.py "$dump" "$n" "$out/locks.txt" \
      "$(basename "$exe")" | c++filt > "$out/functions-$r.txt"
  done
  python3 - "$out" <<'PY'
import sys
out = sys.argv[1]
print(open(f"{out}/machine.txt").read().rstrip())
rows = {}
for line in open(f"{out}/callgrind.txt"):
    route, n, ir = line.split()
    rows[route] = int(ir) / int(n)
    print(f"{route}: {int(n)} requests, {rows[route]:,.0f} instructions per request")
print(f"ratio policy/plain: {rows['policy'] / rows['plain']:.3f}")
print(f"per-function counts: {out}/functions-plain.txt, {out}/functions-policy.txt")
print(f"raw outputs: {out}")
PY
  exit 0
fi

cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Warm-up: pools, the rate-limit table's slot for 127.0.0.1, the allocator.
for r in plain policy; do
  "${prio[@]}" "$exe" load "${url[$r]}" "${load_header[@]}" --rate "$rate" --duration 3s --connections 50 --pin 1 --brief > /dev/null
done
for round in $(seq "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then order=(plain policy); else order=(policy plain); fi
  for r in "${order[@]}"; do
    echo "== round $round: $r" >&2
    t0=$(cpu_of "$gw_pid")
    "${prio[@]}" "$exe" load "${url[$r]}" "${load_header[@]}" --rate "$rate" --duration "$dur" --connections 50 --pin 1 \
      --json "$out/load-$r-$round.json" --brief > "$out/load-$r-$round.txt"
    t1=$(cpu_of "$gw_pid")
    echo "$((t1 - t0))" > "$out/load-$r-$round.ticks"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
python3 - "$out" "$rate" "$dur" "$rounds" <<'PY' | tee "$out/summary.md"
import json, os, statistics, sys
out, rate, dur, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tick = os.sysconf("SC_CLK_TCK")
def run(route, r):
    report = json.load(open(f"{out}/load-{route}-{r}.json"))
    sent = report["sent"]
    ok = sum(n for status, n in report["status"].items() if status.startswith("2"))
    if ok != sent or report["errors"]:
        print(f"warning: {route} round {r}: {ok} of {sent} answered 2xx; statuses {report['status']}, errors {report['errors']}", file=sys.stderr)
    ticks = int(open(f"{out}/load-{route}-{r}.ticks").read())
    return ticks / tick / max(sent, 1) * 1e6, sent, ok
print(open(f"{out}/machine.txt").read().rstrip())
print(f"gateway: 1 serving thread on core 0; load generator and upstream on core 1; {rate} req/s for {dur} per run, 50 connections")
print()
print("| round | plain CPU us/req | policy CPU us/req | ratio policy/plain |")
print("|---|---|---|---|")
ratios = []
for r in range(1, rounds + 1):
    p, q = run("plain", r), run("policy", r)
    ratios.append(q[0] / p[0])
    print(f"| {r} | {p[0]:.2f} ({p[1]} sent) | {q[0]:.2f} ({q[1]} sent) | {ratios[-1]:.3f} |")
print(f"| **median** | | | **{statistics.median(ratios):.3f}** |")
print(f"raw outputs: {out}")
PY
