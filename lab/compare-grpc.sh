#!/usr/bin/env bash
# tailguard vs nginx (Debian's package, `grpc_pass`) as gRPC proxies to the same upstream.
#
# The upstream is the test service of crates/test-support (`test.Echo`, tonic, h2c; run as
# the `grpc_upstream` example, one thread). Both proxies get one worker pinned to core 0
# (`taskset -c 0`), h2c in, keep-alive to the upstream (tailguard: `protocol = "h2c"`, its
# streams multiplexed; nginx: `grpc_pass`, one stream per upstream connection, kept alive)
# and no access log. The load generator (ghz, `--cpus 1`) and the upstream share core 1: the
# proxy is the only thing on core 0, so it is the bottleneck being compared. Steps:
#   1. max unary calls/s: `ghz -c $CONCURRENCY --connections $CONNECTIONS -z $DURATION`
#      (closed loop) on `test.Echo/Unary`, each proxy, $ROUNDS times (default 3), the proxies
#      interleaved, with each proxy's CPU time (user + system) per call;
#   2. the ratios tailguard/nginx per round and their median, and the ratio of each proxy's
#      best round.
# Every process of the benchmark runs at nice $NICE (default -10, when root), as in
# lab/compare-nginx.sh. Raw outputs go to $OUT (default: a temp dir); the summary is printed.
#   DURATION=10s CONCURRENCY=50 CONNECTIONS=4 ROUNDS=3 lab/compare-grpc.sh
# TAILGUARD=<binary> and GRPC_UPSTREAM=<binary> skip the release builds (a smoke run may
# pass debug builds; figures need release ones).
# ghz: `scripts/install-tools` with TAILGUARD_LAB_TOOLS=1 (`go install`, into ~/go/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${DURATION:-10s}
conc=${CONCURRENCY:-50}
conns=${CONNECTIONS:-4}
rounds=${ROUNDS:-3}
out=${OUT:-$(mktemp -d /tmp/compare-grpc.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
PATH="$PATH:$HOME/go/bin"
for tool in nginx ghz taskset python3; do
  command -v "$tool" >/dev/null || { echo "compare-grpc: $tool is not installed" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "compare-grpc: needs 2 cores" >&2; exit 1; }
exe=${TAILGUARD:-target/release/tailguard}
if [ -z "${TAILGUARD:-}" ]; then cargo build --release -q -p tailguard; fi
upstream_exe=${GRPC_UPSTREAM:-target/release/examples/grpc_upstream}
if [ -z "${GRPC_UPSTREAM:-}" ]; then
  cargo build --release -q -p tailguard-test-support --example grpc_upstream
fi

prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
old_group_nice=$(sed -n 's/.*nice //p' /proc/self/autogroup 2>/dev/null || true)
if [ -n "$old_group_nice" ] && [ "$(id -u)" -eq 0 ]; then echo "${NICE:--10}" > /proc/self/autogroup 2>/dev/null || true; fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port); tg_port=$(free_port); ng_port=$(free_port)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$old_group_nice" ]; then echo "$old_group_nice" > /proc/self/autogroup 2>/dev/null || true; fi
}
trap cleanup EXIT

wait_port() {
  for _ in $(seq 100); do
    if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "compare-grpc: nothing listens on port $1" >&2; exit 1
}

"${prio[@]}" taskset -c 1 "$upstream_exe" "127.0.0.1:$up_port" > "$out/upstream.log" 2>&1 &
pids+=($!)
wait_port "$up_port"

sed -e "s|@DIR@|$out|g" -e "s|@LISTEN@|127.0.0.1:$ng_port|g" -e "s|@UPSTREAM@|127.0.0.1:$up_port|g" \
  lab/nginx/grpc.conf > "$out/nginx.conf"
"${prio[@]}" taskset -c 0 nginx -c "$out/nginx.conf" -p "$out" -e "$out/nginx-error.log" > "$out/nginx.log" 2>&1 &
ng_master=$!
pids+=($!)
wait_port "$ng_port"

cat > "$out/tailguard.toml" <<EOF
[[listeners]]
address = "127.0.0.1:$tg_port"

[[upstreams]]
name = "grpc"
protocol = "h2c"
endpoints = [{ address = "127.0.0.1:$up_port" }]

[[routes]]
id = "grpc"
upstream = "grpc"
EOF
RUST_LOG=warn "${prio[@]}" taskset -c 0 "$exe" run --config "$out/tailguard.toml" --threads 1 \
  > "$out/tailguard.log" 2>&1 &
tg_pid=$!
pids+=($!)
wait_port "$tg_port"
proxies=(nginx tailguard)

{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$("$exe" --version); $(nginx -v 2>&1); ghz $(ghz --version 2>&1 | head -1)"
} > "$out/machine.txt"

cpu_of() { local u=0 s=0; for p in "$@"; do read -r pu ps < <(awk '{print $14, $15}' "/proc/$p/stat"); u=$((u + pu)); s=$((s + ps)); done; echo "$u $s"; }
ng_pids=("$ng_master" $(pgrep -P "$ng_master"))
declare -A procs=([nginx]="${ng_pids[*]}" [tailguard]="$tg_pid")
declare -A target=([nginx]="127.0.0.1:$ng_port" [tailguard]="127.0.0.1:$tg_port")
ghz_run() {
  "${prio[@]}" taskset -c 1 ghz --insecure --proto lab/grpc/echo.proto --call test.Echo/Unary \
    -d '{"text":"hello","n":1}' --cpus 1 -c "$conc" --connections "$conns" -z "$1" -O json "$2"
}
for p in "${proxies[@]}"; do
  ghz_run 2s "${target[$p]}" > "$out/warmup-$p.json"
done
# Rounds, the proxies interleaved (each round starts with the other proxy): on a shared
# host the machine's speed drifts by more than the difference measured, and a ratio taken
# inside one round cancels most of that drift.
order() { local n=${#proxies[@]} i; for i in $(seq 0 $((n - 1))); do echo "${proxies[$(( ($1 - 1 + i) % n ))]}"; done; }
for r in $(seq "$rounds"); do
  for p in $(order "$r"); do
    echo "== round $r: ghz max: $p" >&2
    read -r u0 s0 < <(cpu_of ${procs[$p]})
    ghz_run "$dur" "${target[$p]}" > "$out/ghz-$p-$r.json"
    read -r u1 s1 < <(cpu_of ${procs[$p]})
    echo "$((u1 - u0)) $((s1 - s0))" > "$out/ghz-$p-$r.ticks"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

PRIO="${prio[*]:-none}" PROXIES="${proxies[*]}" python3 - "$out" "$dur" "$conc" "$conns" "$rounds" > "$out/summary.md" <<'PY'
import json, os, statistics, sys
out, dur, conc, conns, rounds = sys.argv[1:]
rounds = int(rounds)
proxies = os.environ["PROXIES"].split()
def run(p, r):
    d = json.load(open(f"{out}/ghz-{p}-{r}.json"))
    lat = {int(x["percentage"]): x["latency"] / 1e6 for x in d.get("latencyDistribution") or []}
    codes = d.get("statusCodeDistribution") or {}
    ok = codes.get("OK", 0)
    # ghz closes its connections when -z runs out: the calls still in flight then fail
    # on its side ("use of closed network connection"), whatever the proxy.
    cut = sum(n for msg, n in (d.get("errorDistribution") or {}).items()
              if "use of closed network connection" in msg)
    user, system = (int(x) for x in open(f"{out}/ghz-{p}-{r}.ticks").read().split())
    per = lambda ticks: ticks / os.sysconf("SC_CLK_TCK") / max(ok, 1) * 1e6
    return d["rps"], (per(user + system), per(user), per(system)), lat.get(50, 0), lat.get(99, 0), ok, d["count"] - cut
print(open(f"{out}/machine.txt").read().rstrip())
print(f"proxy: 1 worker on core 0; ghz (--cpus 1) and the upstream on core 1; -c {conc} over {conns} connections, {dur} per run; unary test.Echo/Unary; nice {os.environ.get('PRIO', 'default')}")
print(f"{rounds} rounds, {', '.join(proxies)} interleaved")
print()
print("| round | proxy | calls/s | proxy CPU us/call (user + sys) | P50 ms | P99 ms | OK/total (cut by ghz's stop excluded) |")
print("|---|---|---|---|---|---|---|")
ratios = []
for r in range(1, rounds + 1):
    rows = {p: run(p, r) for p in proxies}
    for p, (rps, us, p50, p99, ok, total) in rows.items():
        print(f"| {r} | {p} | {rps:.0f} | {us[0]:.1f} ({us[1]:.1f} + {us[2]:.1f}) | {p50:.3f} | {p99:.3f} | {ok}/{total} |")
        if ok != total:
            print(f"warning: round {r}: {p}: {total - ok} calls did not end OK", file=sys.stderr)
    t, n = rows["tailguard"], rows["nginx"]
    ratio = (t[0] / n[0], t[1][0] / n[1][0], t[2] / n[2] if n[2] else 0, t[3] / n[3] if n[3] else 0)
    ratios.append(ratio)
    print(f"| {r} | ratio tailguard/nginx | {ratio[0]:.2f} | {ratio[1]:.2f} | {ratio[2]:.2f} | {ratio[3]:.2f} | |")
med = [statistics.median(col) for col in zip(*ratios)]
print(f"| all | **median ratio** | **{med[0]:.2f}** | **{med[1]:.2f}** | {med[2]:.2f} | **{med[3]:.2f}** | |")
# Each proxy's best round: on a shared host noise only ever slows a run down.
best = {}
for p in proxies:
    runs = [run(p, r) for r in range(1, rounds + 1)]
    best[p] = (max(x[0] for x in runs), min(x[1][0] for x in runs), min(x[2] for x in runs), min(x[3] for x in runs))
    b = best[p]
    print(f"| best | {p} | {b[0]:.0f} | {b[1]:.1f} | {b[2]:.3f} | {b[3]:.3f} | |")
r = [t / n if n else 0 for t, n in zip(best["tailguard"], best["nginx"])]
print(f"| best | **ratio of the best rounds** | **{r[0]:.2f}** | **{r[1]:.2f}** | {r[2]:.2f} | **{r[3]:.2f}** | |")
print(f"raw outputs: {out}")
PY
cat "$out/summary.md"
