#!/usr/bin/env bash
# Issue 45's two HTTP/2 resource attacks against tailguard and nginx, with a legitimate
# client throughout, interleaved: for each gateway, a baseline (the client alone), then
# `slow-read` (connections of 100 streams of GET /big, a 4 MiB answer, whose bodies are
# never read) and `held-streams` (connections of 100 POSTs whose body never comes), each
# $SECONDS long, and `rapid-reset` (CVE-2023-44487: streams opened and cancelled at once, in
# a loop) to show the floods stay where they were. The legitimate client is `tailguard load` at $RATE req/s (HTTP/1.1, one
# connection, from 127.0.0.1); the attacker (`tailguard h2-attack`, h2c) binds 127.0.0.2,
# so a per-address limit tells them apart. Both gateways get one serving thread / worker
# pinned to core 0; the upstreams (`tailguard upstream`: 13 bytes on /, 4 MiB on /big), the
# client and the attacker run on core 1. Printed per run: the client's P99 and answered
# share, the host's TCP memory (max of /proc/net/sockstat's `mem`, in MB), the gateway's
# max RSS (MB) and its CPU (% of one core over the attack), and the attacker's counts.
#   SECONDS_EACH=10 RATE=200 SLOW_CONNS=10 HELD_CONNS=200 RAPID_CONNS=10 lab/h2-attacks.sh
# KINDS="none slow-read" runs only those.
# EXTRA_CONFIG=<file> appends a TOML file to tailguard's config (e.g. `[limits]` to compare
# bounds). GATEWAY=<binary> runs another build as the gateway (an older one, to compare).
# TAILGUARD=<binary> skips the release build. Measurements on a shared machine: run it
# under the machine's measurement lock.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${SECONDS_EACH:-10}
rate=${RATE:-200}
slow_conns=${SLOW_CONNS:-10}
held_conns=${HELD_CONNS:-200}
rapid_conns=${RAPID_CONNS:-10}
out=${OUT:-$(mktemp -d /tmp/h2-attacks.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "h2-attacks: $tool is not installed" >&2; exit 1; }
done
exe=${TAILGUARD:-target/release/tailguard}
if [ -z "${TAILGUARD:-}" ]; then cargo build --release -q -p tailguard; fi
# shellcheck source=lab/lib.sh
source lab/lib.sh
trap cleanup EXIT

small_port=$(free_port); big_port=$(free_port)
taskset -c 1 "$exe" upstream --listen "127.0.0.1:$small_port" > "$out/up-small.log" 2>&1 &
pids+=($!)
taskset -c 1 "$exe" upstream --listen "127.0.0.1:$big_port" --body-bytes 4194304 \
  > "$out/up-big.log" 2>&1 &
pids+=($!)
wait_port "$small_port"; wait_port "$big_port"

# tailguard: one listener for h2c (prior knowledge) and HTTP/1.1.
tg_port=$(free_port); tg_metrics=$(free_port)
cat > "$out/tailguard.toml" <<EOF
[[listeners]]
address = "127.0.0.1:$tg_port"

[[upstreams]]
name = "small"
endpoints = [{ address = "127.0.0.1:$small_port" }]

[[upstreams]]
name = "big"
endpoints = [{ address = "127.0.0.1:$big_port" }]

[[routes]]
id = "big"
upstream = "big"
path = { prefix = "/big" }

[[routes]]
id = "small"
upstream = "small"

[access_log]
path = "off"

$(extra_config)
EOF
taskset -c 0 "${GATEWAY:-$exe}" run --config "$out/tailguard.toml" --threads 1 \
  --metrics-listen "127.0.0.1:$tg_metrics" > "$out/tailguard.log" 2>&1 &
tg_pid=$!
pids+=($tg_pid)
wait_port "$tg_port"

# nginx: h2c on one port (nginx 1.22's `listen ... http2` speaks nothing else), HTTP/1.1 on
# another for the legitimate client; the same upstreams, keep-alive.
ng_h2=$(free_port); ng_h1=$(free_port)
mkdir -p "$out/nginx-tmp"
cat > "$out/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $out/nginx.pid;
error_log $out/nginx-error.log warn;
events { worker_connections 30000; }
worker_rlimit_nofile 65536;
http {
    access_log off;
    client_body_temp_path $out/nginx-tmp/cb; proxy_temp_path $out/nginx-tmp/px;
    fastcgi_temp_path $out/nginx-tmp/fc; uwsgi_temp_path $out/nginx-tmp/uw;
    scgi_temp_path $out/nginx-tmp/sc;
    upstream small { server 127.0.0.1:$small_port; keepalive 64; }
    upstream big { server 127.0.0.1:$big_port; keepalive 64; }
    server {
        listen 127.0.0.1:$ng_h2 http2;
        listen 127.0.0.1:$ng_h1;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location /big { proxy_pass http://big; }
        location / { proxy_pass http://small; }
    }
}
EOF
taskset -c 0 nginx -c "$out/nginx.conf" -p "$out" > "$out/nginx.log" 2>&1 &
pids+=($!)
wait_port "$ng_h1"
ng_pid=$(cat "$out/nginx.pid")
ng_worker=$(pgrep -P "$ng_pid" | head -1)

# sample PID SECONDS FILE: every 0.5 s, TCP memory (pages), the process's RSS (kB), and its
# CPU ticks (utime + stime), one line each.
sample() {
  local end=$((SECONDS + $2))
  while [ "$SECONDS" -lt "$end" ]; do
    mem=$(awk '/^TCP:/ { for (i = 1; i < NF; i++) if ($i == "mem") print $(i + 1) }' /proc/net/sockstat)
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0)
    ticks=$(awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0)
    echo "$mem $rss $ticks"
    sleep 0.5
  done > "$3"
}

# run NAME GATEWAY_PID H1_PORT H2_PORT ATTACK: the legitimate client for $secs (plus the
# attack, started a second before it, unless ATTACK is `none`), then one summary line.
run() {
  local name=$1 pid=$2 h1=$3 h2=$4 kind=$5
  local attack_pid=""
  if [ "$kind" != none ]; then
    local conns=$slow_conns
    [ "$kind" = held-streams ] && conns=$held_conns
    [ "$kind" = rapid-reset ] && conns=$rapid_conns
    taskset -c 1 "$exe" h2-attack --kind "$kind" --target "127.0.0.1:$h2" \
      --connections "$conns" --streams 100 --seconds $((secs + 2)) > "$out/$name-$kind-attack.log" 2>&1 &
    attack_pid=$!
    sleep 1
  fi
  sample "$pid" "$secs" "$out/$name-$kind-samples.txt" &
  local sampler=$!
  taskset -c 1 "$exe" load "http://127.0.0.1:$h1/" --rate "$rate" --duration "${secs}s" \
    --connections 1 --timeout 5s --json "$out/$name-$kind-load.json" > "$out/$name-$kind-load.txt" 2>&1 || true
  wait "$sampler" || true
  if [ -n "$attack_pid" ]; then wait "$attack_pid" || true; fi
  python3 - "$name" "$kind" "$out" "$(getconf CLK_TCK)" <<'PY'
import json, sys
name, kind, out, hz = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
r = json.load(open(f"{out}/{name}-{kind}-load.json"))
p99 = dict(r["latency"]["summary"]["percentiles_us"]).get("99", 0) / 1000
ok = r["status"].get("200", 0)
answered = 100.0 * ok / max(r["sent"], 1)
rows = [list(map(int, l.split())) for l in open(f"{out}/{name}-{kind}-samples.txt") if l.strip()]
tcp_mb = max(r[0] for r in rows) * 4096 / 1e6 if rows else 0
rss_mb = max(r[1] for r in rows) / 1024 if rows else 0
cpu = 100.0 * (rows[-1][2] - rows[0][2]) / hz / max(0.5 * (len(rows) - 1), 0.5) if len(rows) > 1 else 0
attack = ""
try:
    attack = open(f"{out}/{name}-{kind}-attack.log").read().strip().splitlines()[-1]
except (FileNotFoundError, IndexError):
    pass
print(f"{name:9} {kind:13} P99 {p99:9.1f} ms  answered {answered:6.2f} %  TCP mem {tcp_mb:7.1f} MB  "
      f"RSS {rss_mb:6.1f} MB  CPU {cpu:5.1f} %  {attack}")
PY
  # Let the attack's connections and the kernel's buffers drain before the next run.
  sleep 3
}

echo "h2-attacks: ${secs}s each, legitimate client at $rate req/s; raw files in $out"
for kind in ${KINDS:-none slow-read held-streams rapid-reset}; do
  run tailguard "$tg_pid" "$tg_port" "$tg_port" "$kind"
  run nginx "$ng_worker" "$ng_h1" "$ng_h2" "$kind"
done
echo "tailguard's refusals and cuts:"
curl -s "http://127.0.0.1:$tg_metrics/metrics" | grep -E '^tailguard_downstream_refused_total|^tailguard_upstream_connections_opened_total' || true
