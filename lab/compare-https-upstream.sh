#!/usr/bin/env bash
# tailguard vs nginx (Debian's package) as a reverse proxy to the same HTTPS upstream.
#
# The origin is nginx serving a fixed 13-byte body over TLS (lab/nginx/https-origin.conf),
# with a certificate for `origin.test` from a throwaway CA made here with openssl. Both
# proxies verify it against that CA under that name (tailguard `[upstreams.tls]` `ca` and
# `sni`; nginx `proxy_ssl_verify on`, `proxy_ssl_name`), keep connections to it alive
# (nginx `keepalive`; tailguard's pool) and reuse TLS sessions (`proxy_ssl_session_reuse
# on`; tailguard's shared session cache), so what is compared is the steady state: TLS
# record encryption and decryption per request, not handshakes.
#
# Both proxies get one worker pinned to core 0 (`taskset -c 0`) and no access log; wrk and
# the origin share core 1. Rounds: `wrk -t1 -c$CONNECTIONS -d$DURATION` (closed loop,
# keep-alive) against each proxy, $ROUNDS times (default 3), the proxies interleaved; the
# proxy's CPU time (user + system, from /proc) is divided by the requests wrk counted.
# Printed: req/s and CPU us per request of each proxy per round, the ratio tailguard/nginx
# per round and its median, and each proxy's best round.
# Every process runs at nice $NICE (default -10, when root), as lab/compare-nginx.sh.
# Raw outputs go to $OUT (default: a temp dir).
#   DURATION=10s CONNECTIONS=50 ROUNDS=3 [TAILGUARD=target/release/tailguard] lab/compare-https-upstream.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${DURATION:-10s}
conns=${CONNECTIONS:-50}
rounds=${ROUNDS:-3}
out=${OUT:-$(mktemp -d /tmp/compare-https-upstream.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx wrk openssl taskset curl; do
  command -v "$tool" >/dev/null || { echo "compare-https-upstream: $tool is not installed" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "compare-https-upstream: needs 2 cores" >&2; exit 1; }
exe=${TAILGUARD:-target/release/tailguard}
if [ -z "${TAILGUARD:-}" ]; then cargo build --release -q -p tailguard; fi

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
    if curl -skf -o /dev/null "$1/healthz" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "compare-https-upstream: nothing answers at $1" >&2; exit 1
}

# A throwaway CA and the origin's certificate for `origin.test` (and 127.0.0.1).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=compare-https-upstream CA" -keyout "$out/ca.key" -out "$out/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/CN=origin.test" -keyout "$out/origin.key" -out "$out/origin.csr" 2>/dev/null
printf 'subjectAltName=DNS:origin.test,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' > "$out/origin.ext"
openssl x509 -req -in "$out/origin.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial \
  -days 2 -extfile "$out/origin.ext" -out "$out/origin.pem" 2>/dev/null

sed -e "s|@DIR@|$out|g" -e "s|@LISTEN@|127.0.0.1:$up_port|g" \
  lab/nginx/https-origin.conf > "$out/origin.conf"
"${prio[@]}" taskset -c 1 nginx -c "$out/origin.conf" -p "$out" -e "$out/origin-error.log" > "$out/origin.log" 2>&1 &
pids+=($!)
wait_port "https://127.0.0.1:$up_port"

sed -e "s|@DIR@|$out|g" -e "s|@LISTEN@|127.0.0.1:$ng_port|g" -e "s|@UPSTREAM@|127.0.0.1:$up_port|g" \
  lab/nginx/https-proxy.conf > "$out/nginx.conf"
"${prio[@]}" taskset -c 0 nginx -c "$out/nginx.conf" -p "$out" -e "$out/nginx-error.log" > "$out/nginx.log" 2>&1 &
ng_master=$!
pids+=($!)
wait_port "http://127.0.0.1:$ng_port"

cat > "$out/tailguard.toml" <<TOML
[[listeners]]
address = "127.0.0.1:$tg_port"

[[upstreams]]
name = "origin"
endpoints = [{ address = "127.0.0.1:$up_port" }]

[upstreams.tls]
ca = "ca.pem"
sni = "origin.test"

[[routes]]
id = "all"
upstream = "origin"
TOML
RUST_LOG=warn "${prio[@]}" taskset -c 0 "$exe" run --config "$out/tailguard.toml" --threads 1 \
  > "$out/tailguard.log" 2>&1 &
tg_pid=$!
pids+=($!)
wait_port "http://127.0.0.1:$tg_port"
proxies=(nginx tailguard)
declare -A url=([nginx]="http://127.0.0.1:$ng_port/" [tailguard]="http://127.0.0.1:$tg_port/")
for p in "${proxies[@]}"; do
  body=$(curl -sf "${url[$p]}") || { echo "compare-https-upstream: $p does not proxy to the origin" >&2; exit 1; }
  [ "$body" = "hello, world" ] || { echo "compare-https-upstream: $p answered '$body'" >&2; exit 1; }
done

{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$("$exe" --version); $(nginx -v 2>&1); $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2); $(openssl version)"
} > "$out/machine.txt"

# CPU ticks used so far by the given processes (all their threads): "user system".
cpu_of() { local u=0 s=0; for p in "$@"; do read -r pu ps < <(awk '{print $14, $15}' "/proc/$p/stat"); u=$((u + pu)); s=$((s + ps)); done; echo "$u $s"; }
ng_pids=("$ng_master" $(pgrep -P "$ng_master"))
declare -A procs=([nginx]="${ng_pids[*]}" [tailguard]="$tg_pid")
for p in "${proxies[@]}"; do
  "${prio[@]}" taskset -c 1 wrk -t1 -c"$conns" -d2s "${url[$p]}" > /dev/null   # warm up pools and sessions
done
# Interleaved rounds (each starts one proxy further down the list): a ratio taken inside one
# round cancels most of a shared host's drift.
order() { local n=${#proxies[@]} i; for i in $(seq 0 $((n - 1))); do echo "${proxies[$(( ($1 - 1 + i) % n ))]}"; done; }
for r in $(seq "$rounds"); do
  for p in $(order "$r"); do
    echo "== round $r: wrk max: $p" >&2
    read -r u0 s0 < <(cpu_of ${procs[$p]})
    "${prio[@]}" taskset -c 1 wrk -t1 -c"$conns" -d"$dur" --latency "${url[$p]}" > "$out/wrk-$p-$r.txt"
    read -r u1 s1 < <(cpu_of ${procs[$p]})
    echo "$((u1 - u0)) $((s1 - s0))" > "$out/wrk-$p-$r.ticks"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

PRIO="${prio[*]:-none}" PROXIES="${proxies[*]}" python3 - "$out" "$dur" "$conns" "$rounds" > "$out/summary.md" <<'PY'
import os, re, statistics, sys
out, dur, conns, rounds = sys.argv[1:]
rounds = int(rounds)
proxies = os.environ["PROXIES"].split()
def wrk(p, r):
    t = open(f"{out}/wrk-{p}-{r}.txt").read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    sock = re.search(r"Socket errors: (.*)", t)
    n = int(re.search(r"(\d+) requests in", t).group(1))
    user, system = (int(x) for x in open(f"{out}/wrk-{p}-{r}.ticks").read().split())
    per = lambda ticks: ticks / os.sysconf("SC_CLK_TCK") / max(n, 1) * 1e6
    return rps, (int(errs.group(1)) if errs else 0), (sock.group(1) if sock else "none"), (per(user + system), per(user), per(system))
print(open(f"{out}/machine.txt").read().rstrip())
print(f"proxy: 1 worker on core 0; wrk -t1 and the HTTPS origin (nginx) on core 1; {conns} connections, {dur} per run; nice {os.environ.get('PRIO', 'default')}")
print(f"{rounds} rounds, {', '.join(proxies)} interleaved; upstream TLS verified, kept alive, sessions reused")
print()
print("| round | proxy | wrk max req/s | proxy CPU us/req (user + sys) |")
print("|---|---|---|---|")
ratios = []
for r in range(1, rounds + 1):
    rows = {p: wrk(p, r) for p in proxies}
    for p, (rps, non2xx, sock, us) in rows.items():
        print(f"| {r} | {p} | {rps:.0f} | {us[0]:.1f} ({us[1]:.1f} + {us[2]:.1f}) |")
        if non2xx or sock != "none":
            print(f"warning: round {r}: {p}: wrk saw {non2xx} non-2xx responses, socket errors: {sock}", file=sys.stderr)
    t, n = rows["tailguard"], rows["nginx"]
    ratio = (t[0] / n[0], t[3][0] / n[3][0])
    ratios.append(ratio)
    print(f"| {r} | ratio tailguard/nginx | {ratio[0]:.2f} | {ratio[1]:.2f} |")
med = [statistics.median(col) for col in zip(*ratios)]
print(f"| all | **median ratio** | **{med[0]:.2f}** | **{med[1]:.2f}** |")
# Each proxy's best round: on a shared host noise only slows a run down.
best = {}
for p in proxies:
    w = [wrk(p, r) for r in range(1, rounds + 1)]
    best[p] = (max(x[0] for x in w), min(x[3][0] for x in w))
    print(f"| best | {p} | {best[p][0]:.0f} | {best[p][1]:.1f} |")
r = [t / n for t, n in zip(best["tailguard"], best["nginx"])]
print(f"| best | **ratio of the best rounds** | **{r[0]:.2f}** | **{r[1]:.2f}** |")
print(f"raw outputs: {out}")
PY
cat "$out/summary.md"
