#!/usr/bin/env bash
# tailguard vs nginx (Debian's package) as a reverse proxy to the same upstream.
#
# Both proxies get one worker pinned to core 0 (`taskset -c 0`), keep-alive to the
# upstream and no access log. The load tools and the upstream (`tailguard upstream`, one
# thread, 13-byte body) share core 1: the proxy is the only thing on core 0, so it is the
# bottleneck being compared. Steps:
#   1. max req/s: `wrk -t1 -c$CONNECTIONS -d$DURATION` (closed loop, keep-alive), each proxy,
#      $ROUNDS times (default 3), the proxies interleaved;
#   2. latency at a fixed rate of half nginx's median max: `oha -q R --latency-correction`
#      (open loop, corrected for coordinated omission): P50/P99/P99.9/P100, each proxy,
#      $ROUNDS times, interleaved;
#   3. the ratios tailguard/nginx per round and their median (target: throughput >= 1.0,
#      P99 <= 1.0).
# BASELINE=<another tailguard binary> adds it as a third proxy ("baseline") to every round,
# interleaved with the other two, and prints tailguard/baseline ratios as well: a change's
# cost measured in the same rounds as nginx. WRK_THREADS (default 1) sets wrk's threads.
# Every process of the benchmark runs at nice $NICE (default -10, when root) so builds and
# tests running beside it on a shared machine take CPU from neither proxy.
# Raw outputs go to $OUT (default: a temp dir); the summary is printed.
#   DURATION=10s CONNECTIONS=50 ROUNDS=3 [WRK_THREADS=2] [BASELINE=old/tailguard] lab/compare-nginx.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${DURATION:-10s}
conns=${CONNECTIONS:-50}
rounds=${ROUNDS:-3}
wrk_threads=${WRK_THREADS:-1}
baseline=${BASELINE:-}
out=${OUT:-$(mktemp -d /tmp/compare-nginx.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx wrk oha taskset; do
  command -v "$tool" >/dev/null || { echo "compare-nginx: $tool is not installed" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "compare-nginx: needs 2 cores" >&2; exit 1; }
exe=${TAILGUARD:-target/release/tailguard}
if [ -z "${TAILGUARD:-}" ]; then cargo build --release -q -p tailguard; fi

prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# With kernel.sched_autogroup_enabled the CPU is first shared between sessions, so a nice
# value alone loses to other sessions' builds: raise this session's autogroup too (restored
# at exit), as lab/validate.sh does.
old_group_nice=$(sed -n 's/.*nice //p' /proc/self/autogroup 2>/dev/null || true)
if [ -n "$old_group_nice" ] && [ "$(id -u)" -eq 0 ]; then echo "${NICE:--10}" > /proc/self/autogroup 2>/dev/null || true; fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port); tg_port=$(free_port); ng_port=$(free_port); bl_port=$(free_port)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$old_group_nice" ]; then echo "$old_group_nice" > /proc/self/autogroup 2>/dev/null || true; fi
}
trap cleanup EXIT

wait_port() {
  for _ in $(seq 100); do
    if curl -sf -o /dev/null "http://127.0.0.1:$1/healthz" 2>/dev/null || curl -s -o /dev/null "http://127.0.0.1:$1/" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "compare-nginx: nothing answers on port $1" >&2; exit 1
}

"${prio[@]}" taskset -c 1 "$exe" upstream --listen "127.0.0.1:$up_port" --threads 1 --body-bytes 13 > "$out/upstream.log" 2>&1 &
pids+=($!)
wait_port "$up_port"

sed -e "s|@DIR@|$out|g" -e "s|@LISTEN@|127.0.0.1:$ng_port|g" -e "s|@UPSTREAM@|127.0.0.1:$up_port|g" \
  lab/nginx/proxy.conf > "$out/nginx.conf"
"${prio[@]}" taskset -c 0 nginx -c "$out/nginx.conf" -p "$out" -e "$out/nginx-error.log" > "$out/nginx.log" 2>&1 &
ng_master=$!
pids+=($!)
wait_port "$ng_port"

RUST_LOG=warn "${prio[@]}" taskset -c 0 "$exe" run --listen "127.0.0.1:$tg_port" --threads 1 \
  --upstream "demo=127.0.0.1:$up_port" > "$out/tailguard.log" 2>&1 &
tg_pid=$!
pids+=($!)
wait_port "$tg_port"
proxies=(nginx tailguard)
if [ -n "$baseline" ]; then
  RUST_LOG=warn "${prio[@]}" taskset -c 0 "$baseline" run --listen "127.0.0.1:$bl_port" --threads 1 \
    --upstream "demo=127.0.0.1:$up_port" > "$out/baseline.log" 2>&1 &
  bl_pid=$!
  pids+=($!)
  wait_port "$bl_port"
  proxies+=(baseline)
fi

{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$("$exe" --version); $(nginx -v 2>&1); $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2); $(oha --version)"
  if [ -n "$baseline" ]; then echo "baseline: $baseline ($("$baseline" --version))"; fi
} > "$out/machine.txt"

# CPU ticks used so far by the given processes (all their threads): "user system".
cpu_of() { local u=0 s=0; for p in "$@"; do read -r pu ps < <(awk '{print $14, $15}' "/proc/$p/stat"); u=$((u + pu)); s=$((s + ps)); done; echo "$u $s"; }
ng_pids=("$ng_master" $(pgrep -P "$ng_master"))
declare -A procs=([nginx]="${ng_pids[*]}" [tailguard]="$tg_pid" [baseline]="${bl_pid:-}")
declare -A url=([nginx]="http://127.0.0.1:$ng_port/" [tailguard]="http://127.0.0.1:$tg_port/" [baseline]="http://127.0.0.1:$bl_port/")
for p in "${proxies[@]}"; do
  "${prio[@]}" taskset -c 1 wrk -t"$wrk_threads" -c"$conns" -d2s "${url[$p]}" > /dev/null   # warm up pools and caches
done
# Rounds, the proxies interleaved (each round starts one proxy further down the list): on
# a shared host the speed of the machine drifts by more than the difference being
# measured, and a ratio taken inside one round cancels most of that drift.
order() { local n=${#proxies[@]} i; for i in $(seq 0 $((n - 1))); do echo "${proxies[$(( ($1 - 1 + i) % n ))]}"; done; }
for r in $(seq "$rounds"); do
  for p in $(order "$r"); do
    echo "== round $r: wrk max: $p" >&2
    read -r u0 s0 < <(cpu_of ${procs[$p]})
    "${prio[@]}" taskset -c 1 wrk -t"$wrk_threads" -c"$conns" -d"$dur" --latency "${url[$p]}" > "$out/wrk-$p-$r.txt"
    read -r u1 s1 < <(cpu_of ${procs[$p]})
    echo "$((u1 - u0)) $((s1 - s0))" > "$out/wrk-$p-$r.ticks"
  done
done
# The fixed rate: half of nginx's median max over the rounds.
rate=$(python3 -c "
import re, statistics, sys
rps = [float(re.search(r'Requests/sec:\s+([\d.]+)', open(f'$out/wrk-nginx-{r}.txt').read()).group(1)) for r in range(1, $rounds + 1)]
print(max(1, int(statistics.median(rps) / 2)))")
for r in $(seq "$rounds"); do
  for p in $(order "$r"); do
    echo "== round $r: oha -q $rate: $p" >&2
    "${prio[@]}" taskset -c 1 oha "${url[$p]}" -q "$rate" -z "$dur" -c "$conns" --latency-correction \
      --no-tui --output-format json > "$out/oha-$p-$r.json"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

PRIO="${prio[*]:-none}" PROXIES="${proxies[*]}" WRK_THREADS="$wrk_threads" python3 - "$out" "$rate" "$dur" "$conns" "$rounds" > "$out/summary.md" <<'PY'
import json, os, re, statistics, sys
out, rate, dur, conns, rounds = sys.argv[1:]
rounds = int(rounds)
proxies = os.environ["PROXIES"].split()
def wrk(p, r):
    t = open(f"{out}/wrk-{p}-{r}.txt").read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    sock = re.search(r"Socket errors: (.*)", t)
    n = int(re.search(r"(\d+) requests in", t).group(1))
    user, system = (int(x) for x in open(f"{out}/wrk-{p}-{r}.ticks").read().split())
    per = lambda ticks: ticks / os.sysconf("SC_CLK_TCK") / n * 1e6
    us = (per(user + system), per(user), per(system))
    return rps, (int(errs.group(1)) if errs else 0), (sock.group(1) if sock else "none"), us
def oha(p, r):
    d = json.load(open(f"{out}/oha-{p}-{r}.json"))
    lp = d["latencyPercentiles"]
    ms = {k: lp[k] * 1000 for k in ("p50", "p99", "p99.9")}
    ms["p100"] = d["summary"]["slowest"] * 1000
    codes = d.get("statusCodeDistribution", {})
    ok = codes.get("200", 0)
    total = sum(codes.values()) + sum(d.get("errorDistribution", {}).values())
    return ms, d["summary"]["requestsPerSec"], ok, total
print(open(f"{out}/machine.txt").read().rstrip())
print(f"proxy: 1 worker on core 0; wrk (-t{os.environ['WRK_THREADS']})/oha and the upstream on core 1; {conns} connections, {dur} per run; nice {os.environ.get('PRIO', 'default')}")
print(f"{rounds} rounds, {', '.join(proxies)} interleaved; fixed rate = half of nginx's median max")
print()
print(f"| round | proxy | wrk max req/s | proxy CPU us/req (user + sys) | oha -q {rate}: P50 ms | P99 ms | P99.9 ms | P100 ms | achieved req/s | 200s/total |")
print("|---|---|---|---|---|---|---|---|---|---|")
ratios = []
base_ratios = []
def ratio_of(t, n):
    (t_rps, _, _, t_us), (t_ms, *_) = t
    (n_rps, _, _, n_us), (n_ms, *_) = n
    return (t_rps / n_rps, t_us[0] / n_us[0], t_ms["p50"] / n_ms["p50"], t_ms["p99"] / n_ms["p99"],
            t_ms["p99.9"] / n_ms["p99.9"], t_ms["p100"] / n_ms["p100"])
for r in range(1, rounds + 1):
    rows = {p: (wrk(p, r), oha(p, r)) for p in proxies}
    for p, ((rps, non2xx, sock, us), (ms, ach, ok, total)) in rows.items():
        print(f"| {r} | {p} | {rps:.0f} | {us[0]:.1f} ({us[1]:.1f} + {us[2]:.1f}) | {ms['p50']:.3f} | {ms['p99']:.3f} | {ms['p99.9']:.3f} | {ms['p100']:.3f} | {ach:.0f} | {ok}/{total} |")
        if non2xx or sock != "none":
            print(f"warning: round {r}: {p}: wrk saw {non2xx} non-2xx responses, socket errors: {sock}", file=sys.stderr)
    ratio = ratio_of(rows["tailguard"], rows["nginx"])
    ratios.append(ratio)
    print(f"| {r} | ratio tailguard/nginx | {ratio[0]:.2f} | {ratio[1]:.2f} | {ratio[2]:.2f} | {ratio[3]:.2f} | {ratio[4]:.2f} | {ratio[5]:.2f} | | |")
    if "baseline" in rows:
        b = ratio_of(rows["tailguard"], rows["baseline"])
        base_ratios.append(b)
        print(f"| {r} | ratio tailguard/baseline | {b[0]:.3f} | {b[1]:.3f} | {b[2]:.2f} | {b[3]:.2f} | {b[4]:.2f} | {b[5]:.2f} | | |")
med = [statistics.median(col) for col in zip(*ratios)]
print(f"| all | **median ratio** | **{med[0]:.2f}** | **{med[1]:.2f}** | {med[2]:.2f} | **{med[3]:.2f}** | {med[4]:.2f} | {med[5]:.2f} | | |")
if base_ratios:
    m = [statistics.median(col) for col in zip(*base_ratios)]
    print(f"| all | **median ratio tailguard/baseline** | **{m[0]:.3f}** | **{m[1]:.3f}** | {m[2]:.2f} | **{m[3]:.2f}** | {m[4]:.2f} | {m[5]:.2f} | | |")
# Each proxy's best round (most req/s, least CPU per request, lowest percentiles): on a
# shared host noise only ever slows a run down, so the best of several rounds is the
# closest to each proxy's own cost, whichever rounds the neighbours were busy in.
best = {}
for p in proxies:
    w = [wrk(p, r) for r in range(1, rounds + 1)]
    o = [oha(p, r) for r in range(1, rounds + 1)]
    best[p] = (max(x[0] for x in w), min(x[3][0] for x in w),
               *(min(x[0][k] for x in o) for k in ("p50", "p99", "p99.9", "p100")))
    b = best[p]
    print(f"| best | {p} | {b[0]:.0f} | {b[1]:.1f} | {b[2]:.3f} | {b[3]:.3f} | {b[4]:.3f} | {b[5]:.3f} | | |")
r = [t / n for t, n in zip(best["tailguard"], best["nginx"])]
print(f"| best | **ratio of the best rounds** | **{r[0]:.2f}** | **{r[1]:.2f}** | {r[2]:.2f} | **{r[3]:.2f}** | {r[4]:.2f} | {r[5]:.2f} | | |")
if "baseline" in best:
    r = [t / b for t, b in zip(best["tailguard"], best["baseline"])]
    print(f"| best | **ratio of the best rounds, tailguard/baseline** | **{r[0]:.3f}** | **{r[1]:.3f}** | {r[2]:.2f} | **{r[3]:.2f}** | {r[4]:.2f} | {r[5]:.2f} | | |")
print(f"raw outputs: {out}")
PY
cat "$out/summary.md"
