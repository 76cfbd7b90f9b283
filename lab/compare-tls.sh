#!/usr/bin/env bash
# TLS termination: gateway CPU per completed request and requests per second, tailguard
# against nginx (one worker), HTTP/1.1 over TLS 1.3 (`wrk`) and HTTP/2 over TLS 1.3
# (`h2load`), rounds interleaved (issue 25). Closed loop: each run is as fast as the
# gateway goes, so the figure that compares is CPU per request (utime + stime of the
# serving process over the run divided by the requests completed), with req/s beside it.
#
# Topology (2 cores): the gateway (tailguard one serving thread, metrics on; nginx one
# worker; both TLS 1.3 with the same P-256 certificate, keep-alive, no access log) on core
# 1; the load tool and the origin (nginx, a fixed 13-byte body) on core 0. A fresh gateway
# per run. HTTP/1.1: `wrk -t1 -c$CONNECTIONS -d$DURATION`. HTTP/2: `h2load -c$H2_CLIENTS
# -m$H2_STREAMS -D$DURATION` (ALPN h2).
#   ROUNDS=4 DURATION=10 [A=old/tailguard] [MODES="h1 h2"] lab/compare-tls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
a=${A:-}
dur=${DURATION:-10}
rounds=${ROUNDS:-4}
conns=${CONNECTIONS:-32}
h2_clients=${H2_CLIENTS:-8}
h2_streams=${H2_STREAMS:-16}
modes=${MODES:-h1 h2}
out=${OUT:-$(mktemp -d /tmp/compare-tls.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx wrk h2load openssl taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "compare-tls: $tool is not installed" >&2; exit 1; }
done
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
wait_url() {
  for _ in $(seq 200); do curl -kfs -o /dev/null "$1" && return 0; sleep 0.05; done
  echo "compare-tls: nothing answers at $1" >&2; exit 1
}
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$out/key.pem" -out "$out/cert.pem" 2>/dev/null
start_origin 0

start_gateway() { # name -> gw_pid (whose CPU counts), stop_pid, gw_port
  gw_port=$(free_port)
  if [ "$1" = nginx ]; then
    cat > "$out/nginx.conf" <<EOF2
worker_processes 1;
daemon off;
pid $out/nginx.pid;
error_log $out/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $out/cb; proxy_temp_path $out/px; fastcgi_temp_path $out/fc;
    uwsgi_temp_path $out/uw; scgi_temp_path $out/sc;
    keepalive_requests 1000000;
    http2_max_requests 1000000;
    ssl_protocols TLSv1.3;
    ssl_certificate $out/cert.pem;
    ssl_certificate_key $out/key.pem;
    upstream backend { server 127.0.0.1:$up_port; keepalive 128; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$gw_port ssl http2;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto \$scheme;
        }
    }
}
EOF2
    "${prio[@]}" taskset -c 1 nginx -c "$out/nginx.conf" -p "$out" >> "$out/nginx.log" 2>&1 &
    stop_pid=$!
    pids+=("$stop_pid")
    wait_url "https://127.0.0.1:$gw_port/"
    gw_pid=$(pgrep -P "$stop_pid" | head -1)
  else
    local exe=$b
    [ "$1" = baseline ] && exe=$a
    proxy_config "127.0.0.1:$gw_port" "tls = { cert = \"$out/cert.pem\", key = \"$out/key.pem\" }
tls_min_version = \"1.3\"" > "$out/gateway.toml"
    "${prio[@]}" taskset -c 1 "$exe" run --config "$out/gateway.toml" --threads 1 \
      --metrics-listen 127.0.0.1:0 >> "$out/gateway.log" 2>&1 &
    gw_pid=$!
    stop_pid=$gw_pid
    pids+=("$gw_pid")
    wait_url "https://127.0.0.1:$gw_port/"
  fi
}
ticks=$(getconf CLK_TCK)
cpu_of() { awk '{print $14, $15}' "/proc/$1/stat"; }
run_one() { # name mode round -> "user_us sys_us requests rps"
  local name=$1 mode=$2 r=$3 before after n rps
  start_gateway "$name"
  local url="https://127.0.0.1:$gw_port/"
  if [ "$mode" = h1 ]; then
    "${prio[@]}" taskset -c 0 wrk -t1 -c"$conns" -d2s "$url" > /dev/null
    before=$(cpu_of "$gw_pid")
    "${prio[@]}" taskset -c 0 wrk -t1 -c"$conns" -d"${dur}s" "$url" > "$out/$mode-$name-$r.txt"
    after=$(cpu_of "$gw_pid")
    n=$(awk '/requests in/ {print $1}' "$out/$mode-$name-$r.txt")
    rps=$(awk '/Requests\/sec/ {print $2}' "$out/$mode-$name-$r.txt")
  else
    "${prio[@]}" taskset -c 0 h2load -c"$h2_clients" -m"$h2_streams" -D2 "$url" > /dev/null
    before=$(cpu_of "$gw_pid")
    "${prio[@]}" taskset -c 0 h2load -c"$h2_clients" -m"$h2_streams" -D"$dur" "$url" > "$out/$mode-$name-$r.txt"
    after=$(cpu_of "$gw_pid")
    n=$(awk '/^requests:/ {print $8}' "$out/$mode-$name-$r.txt")
    rps=$(awk '/^finished in/ {print $4}' "$out/$mode-$name-$r.txt")
  fi
  kill "$stop_pid"; wait "$stop_pid" 2>/dev/null || true
  python3 -c "
b=[int(x) for x in '$before'.split()]; a=[int(x) for x in '$after'.split()]; n=int('$n')
print(f'{(a[0]-b[0])*1e6/$ticks/n:.3f} {(a[1]-b[1])*1e6/$ticks/n:.3f} {n} $rps')"
}
gateways=(nginx tailguard)
[ -n "$a" ] && gateways+=(baseline)
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "tailguard: $b ($("$b" --version))"
  if [ -n "$a" ]; then echo "baseline: $a"; fi
  echo "$(nginx -v 2>&1); $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2); $(h2load --version | head -1)"
} > "$out/machine.txt"
: > "$out/rounds.txt"
for r in $(seq "$rounds"); do
  k=${#gateways[@]}
  for i in $(seq 0 $((k - 1))); do
    name=${gateways[$(( (r - 1 + i) % k ))]}
    for mode in $modes; do
      echo "== round $r: $name $mode" >&2
      echo "$r $name $mode $(run_one "$name" "$mode" "$r")" >> "$out/rounds.txt"
    done
  done
done
python3 - "$out/rounds.txt" "$dur" <<'PY' | tee "$out/summary.txt"
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r, name, mode, u, s, n, rps = line.split()
    rows.setdefault(mode, {}).setdefault(int(r), {})[name] = (float(u), float(s), int(n), float(rps))
print(open(sys.argv[1].replace("rounds.txt", "machine.txt")).read().rstrip())
for mode, by_round in rows.items():
    tool = "wrk -t1 (HTTP/1.1 over TLS 1.3)" if mode == "h1" else "h2load (HTTP/2 over TLS 1.3)"
    print(f"\n{mode}: {tool}, {sys.argv[2]} s per run; CPU per request (µs, user + sys) and req/s")
    names = [n for n in ("nginx", "tailguard", "baseline") if n in by_round[min(by_round)]]
    ratios, rps_ratios, base = [], [], []
    for r in sorted(by_round):
        row = by_round[r]
        cells = "  ".join(f"{n}: {row[n][0]:.2f} + {row[n][1]:.2f} = {row[n][0] + row[n][1]:.2f} µs, {row[n][3]:.0f}/s" for n in names)
        t, g = row["tailguard"], row["nginx"]
        ratios.append((t[0] + t[1]) / (g[0] + g[1])); rps_ratios.append(t[3] / g[3])
        extra = ""
        if "baseline" in row:
            bl = row["baseline"]; base.append((t[0] + t[1]) / (bl[0] + bl[1])); extra = f", tg/baseline CPU {base[-1]:.3f}"
        print(f"  round {r}: {cells}; tg/nginx CPU {ratios[-1]:.3f}, req/s {rps_ratios[-1]:.3f}{extra}")
    print(f"  median tg/nginx CPU per request {statistics.median(ratios):.3f}, req/s {statistics.median(rps_ratios):.3f}"
          + (f"; tg/baseline CPU {statistics.median(base):.3f}" if base else ""))
PY
echo "raw: $out"
