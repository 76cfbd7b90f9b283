#!/usr/bin/env bash
# Memory per idle keep-alive connection, and memory returned after a connection storm:
# tailguard against nginx (Debian's package), rounds interleaved (issue 25).
#
# Each gateway proxies to the same origin (nginx, one worker, a fixed 13-byte body) and
# serves with one thread / one worker. For each mode in $MODES, a run opens $CONNECTIONS
# connections to it, sends one request on each and reads the whole answer, then holds them
# all idle for $HOLD seconds (6: past tailguard's `timeouts.park_ms`, after which an idle
# HTTP/1.1 connection parks, and past the serving thread's next few once-a-second returns of
# freed memory to the system: at 3 s, some rounds still count the served state); it prints
# the serving process's RSS (VmRSS) before, then held, and 2 s and 10 s after all of them
# closed, and (held - before) / N per connection. Modes:
#   h1      HTTP/1.1, plain TCP
#   h1-tls  HTTP/1.1 over TLS 1.3 (ALPN http/1.1)
#   h2c     HTTP/2 with prior knowledge (one stream, then idle)
#   h2-tls  HTTP/2 over TLS 1.3 (ALPN h2)
# A fresh gateway process per run (started, one warm request, measured, stopped), so one
# run's leftovers never count in the next. Bounded: 127.0.0.1 only, $CONNECTIONS at most
# a few thousand, each step with a deadline.
#   CONNECTIONS=3000 ROUNDS=2 HOLD=6 MODES="h1 h1-tls h2c h2-tls" [A=old/tailguard] lab/idle-memory.sh
# A=<another tailguard binary> adds it as a third gateway ("baseline") to every round.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${CONNECTIONS:-3000}
hold=${HOLD:-6}
rounds=${ROUNDS:-2}
modes=${MODES:-h1 h1-tls h2c h2-tls}
exe=${TAILGUARD:-target/release/tailguard}
baseline=${A:-}
out=${OUT:-$(mktemp -d /tmp/idle-memory.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx openssl python3 curl; do
  command -v "$tool" >/dev/null || { echo "idle-memory: $tool is not installed" >&2; exit 1; }
done
ulimit -n $((n * 2 + 1024))
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
wait_port() { # port [tls]
  local scheme=http; [ "${2:-}" = tls ] && scheme=https
  for _ in $(seq 200); do curl -ks -o /dev/null "$scheme://127.0.0.1:$1/" && return 0; sleep 0.05; done
  echo "idle-memory: nothing answers on port $1" >&2; exit 1
}

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$out/key.pem" -out "$out/cert.pem" 2>/dev/null

start_origin "0-$(($(nproc) - 1))"
origin_port=$up_port

# The gateways: a plain port (HTTP/1.1 and h2c) and a TLS port (ALPN h2 and http/1.1).
start_tailguard() { # exe -> sets gw_pid, plain_port, tls_port
  plain_port=$(free_port); tls_port=$(free_port)
  # The lab's one-route config, with a second listener (TLS) after the plain one.
  proxy_config "127.0.0.1:$plain_port" "
[[listeners]]
address = \"127.0.0.1:$tls_port\"
tls = { cert = \"$out/cert.pem\", key = \"$out/key.pem\" }
tls_min_version = \"1.3\"" > "$out/gateway.toml"
  RUST_LOG=warn "$1" run --config "$out/gateway.toml" --threads 1 --metrics-listen 127.0.0.1:0 \
    >> "$out/gateway.log" 2>&1 &
  gw_pid=$!
  pids+=("$gw_pid")
  wait_port "$plain_port"; wait_port "$tls_port" tls
  serving_pid=$gw_pid
}
start_nginx() { # -> sets gw_pid (the master), serving_pid (the worker), plain_port, tls_port
  plain_port=$(free_port); tls_port=$(free_port)
  cat > "$out/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $out/nginx.pid;
error_log $out/nginx-error.log warn;
worker_rlimit_nofile $((n * 2 + 1024));
events { worker_connections $((n * 2 + 512)); }
http {
    access_log off;
    client_body_temp_path $out/cb; proxy_temp_path $out/px; fastcgi_temp_path $out/fc;
    uwsgi_temp_path $out/uw; scgi_temp_path $out/sc;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    ssl_protocols TLSv1.3;
    ssl_certificate $out/cert.pem;
    ssl_certificate_key $out/key.pem;
    upstream backend { server 127.0.0.1:$origin_port; keepalive 128; }
    server {
        listen 127.0.0.1:$plain_port http2;
        listen 127.0.0.1:$tls_port ssl http2;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
  nginx -c "$out/nginx.conf" -p "$out" > "$out/nginx.log" 2>&1 &
  gw_pid=$!
  pids+=("$gw_pid")
  wait_port "$tls_port" tls
  serving_pid=$(pgrep -P "$gw_pid" | head -1)
}
# nginx's plain port speaks h2c only with `http2` on it and HTTP/1.1 only without; give
# HTTP/1.1 its own server when the mode needs it.
start_nginx_h1() {
  start_nginx
  kill "$gw_pid"; wait "$gw_pid" 2>/dev/null || true
  sed -i "s|listen 127.0.0.1:$plain_port http2;|listen 127.0.0.1:$plain_port;|" "$out/nginx.conf"
  nginx -c "$out/nginx.conf" -p "$out" > "$out/nginx.log" 2>&1 &
  gw_pid=$!
  pids+=("$gw_pid")
  wait_port "$plain_port"
  serving_pid=$(pgrep -P "$gw_pid" | head -1)
}

# The client: opens N connections, one request each, holds them; prints RSS readings of
# the serving process at each step (kB).
cat > "$out/client.py" <<'PY'
import os, socket, ssl, struct, sys, time
mode, port, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
hold = float(sys.argv[5])
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
def settle():
    # The figure once it stops moving (the server may still be finishing its work).
    last = rss()
    for _ in range(20):
        time.sleep(0.1)
        now = rss()
        if now == last:
            return now
        last = now
    return last
def connect():
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if mode.endswith("-tls"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.set_alpn_protocols(["h2"] if mode.startswith("h2") else ["http/1.1"])
        s = ctx.wrap_socket(s, server_hostname="localhost")
    return s
def recv_exact(s, k):
    b = b""
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c:
            raise SystemExit("idle-memory: the server closed a connection")
        b += c
    return b
def h1(s):
    s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got:
        c = s.recv(4096)
        if not c:
            raise SystemExit("idle-memory: the server closed a connection")
        got += c
    head, body = got.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    if len(body) < length:
        recv_exact(s, length - len(body))
def h2(s):
    # Preface, empty SETTINGS, one GET on stream 1 (HPACK: :method GET, :path /,
    # :scheme http/https, :authority localhost as a literal), read until its END_STREAM.
    scheme = 0x87 if mode.endswith("-tls") else 0x86
    block = bytes([0x82, 0x84, scheme, 0x41, 9]) + b"localhost"
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + struct.pack(">I", 0)[1:] + b"\x04\x00" + b"\x00\x00\x00\x00"
              + struct.pack(">I", len(block))[1:] + b"\x01\x05\x00\x00\x00\x01" + block)
    acked = False
    while True:
        hdr = recv_exact(s, 9)
        length = int.from_bytes(hdr[:3], "big")
        kind, flags, stream = hdr[3], hdr[4], int.from_bytes(hdr[5:9], "big") & 0x7fffffff
        recv_exact(s, length)
        if kind == 4 and not flags & 1 and not acked:
            s.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")  # SETTINGS ack
            acked = True
        if kind == 7:
            raise SystemExit("idle-memory: GOAWAY")
        if stream == 1 and kind in (0, 1) and flags & 1:
            return
before = settle()
conns = []
t0 = time.monotonic()
for _ in range(n):
    s = connect()
    (h2 if mode.startswith("h2") else h1)(s)
    conns.append(s)
opened = time.monotonic() - t0
# Held idle for longer than tailguard's `timeouts.park_ms` (1 s) before the reading: the
# figure is that of connections idle for a while, not of ones just served.
time.sleep(hold)
held = settle()
for s in conns:
    s.close()
conns.clear()
time.sleep(2)
after2 = rss()
time.sleep(8)
after10 = rss()
print(f"{before} {held} {after2} {after10} {opened:.1f}")
PY

run_one() { # gateway mode round
  local gw=$1 mode=$2 r=$3
  case $gw in
    tailguard) start_tailguard "$exe" ;;
    baseline) start_tailguard "$baseline" ;;
    nginx) if [ "$mode" = h1 ]; then start_nginx_h1; else start_nginx; fi ;;
  esac
  local port=$plain_port
  case $mode in *-tls) port=$tls_port ;; esac
  local res
  res=$(timeout 300 python3 "$out/client.py" "$mode" "$port" "$n" "$serving_pid" "$hold")
  echo "$r $gw $mode $res" >> "$out/rounds.txt"
  kill "$gw_pid"; wait "$gw_pid" 2>/dev/null || true
}

gateways=(tailguard nginx)
[ -n "$baseline" ] && gateways+=(baseline)
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "$("$exe" --version); $(nginx -v 2>&1); $(openssl version)"
  [ -n "$baseline" ] && echo "baseline: $baseline ($("$baseline" --version))"
} > "$out/machine.txt"
: > "$out/rounds.txt"
for r in $(seq "$rounds"); do
  # Interleaved: each round starts one gateway further down the list.
  k=${#gateways[@]}
  for i in $(seq 0 $((k - 1))); do
    gw=${gateways[$(( (r - 1 + i) % k ))]}
    for mode in $modes; do
      echo "== round $r: $gw $mode" >&2
      run_one "$gw" "$mode" "$r"
    done
  done
done

python3 - "$out/rounds.txt" "$n" <<'PY' | tee "$out/summary.txt"
import statistics, sys
n = int(sys.argv[2])
rows = [l.split() for l in open(sys.argv[1])]
print(open(sys.argv[1].replace("rounds.txt", "machine.txt")).read().rstrip())
print(f"{n} connections per run, one request each, then held idle; RSS of the serving process (kB)")
print("round  gateway    mode     before    held  +2s closed  +10s closed   KB/conn  kept after 10 s")
per = {}
for r, gw, mode, before, held, a2, a10, secs in rows:
    before, held, a2, a10 = int(before), int(held), int(a2), int(a10)
    kb = (held - before) / n
    per.setdefault((gw, mode), []).append((kb, a10 - before))
    print(f"{r:>5}  {gw:<9}  {mode:<7} {before:>7} {held:>7} {a2:>11} {a10:>12} {kb:>9.2f} {a10 - before:>9} kB")
print()
print("median KB per idle connection (and kB kept 10 s after the close):")
for (gw, mode), v in sorted(per.items(), key=lambda x: (x[0][1], x[0][0])):
    print(f"  {mode:<7} {gw:<9} {statistics.median(k for k, _ in v):6.2f} KB/conn   kept {statistics.median(a for _, a in v):8.0f} kB")
PY
echo "raw: $out"
