#!/usr/bin/env bash
# The status page at scale (issue 48): 1,000 routes and 100 upstreams of 10 endpoints, each
# route with traffic. Prints how long /status.json takes to serve (built on the exporter
# thread: the registry read, the document, its JSON) and its size, and how long a headless
# Chromium takes to draw it (the page's own measure of its render, from --dump-dom).
#   ROUTES=1000 UPSTREAMS=100 ENDPOINTS=10 lab/status-scale.sh
# The gateway runs one serving thread on core 1; curl, Chromium and the origin (one nginx
# worker listening on $ENDPOINTS ports) on core 0: upstream u's endpoint e is that nginx's
# e-th port, so every (upstream, endpoint) is distinct and answers.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
routes=${ROUTES:-1000}
upstreams=${UPSTREAMS:-100}
endpoints=${ENDPOINTS:-10}
samples=${SAMPLES:-20}
out=${OUT:-$(mktemp -d /tmp/status-scale.XXXXXX)}
mkdir -p "$out"
for tool in nginx taskset python3 curl chromium; do
  command -v "$tool" >/dev/null || { echo "status-scale: $tool is not installed" >&2; exit 1; }
done
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
wait_metrics() { # port: returns once the exporter answers /metrics (30 s at most)
  for _ in $(seq 600); do curl -fs -o /dev/null "http://127.0.0.1:$1/metrics" && return 0; sleep 0.05; done
  echo "$(basename "$0"): no exporter on port $1" >&2
  exit 1
}
ports=$(python3 -c "
import socket
ss = [socket.socket() for _ in range($endpoints)]
for s in ss: s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in ss))")
more=""
for p in ${ports#* }; do more+="listen 127.0.0.1:$p; "; done
nginx_answering origin 0 "server { $more location / { return 200 \"hello, world\\n\"; } }" \
  'return 200 "hello, world\n";'
ports="$answer_port ${ports#* }"
gw_port=$(free_port)
metrics_port=$(free_port)
python3 - "$routes" "$upstreams" "$gw_port" $ports > "$out/gateway.toml" <<'PY'
import sys
routes, ups, gw = (int(x) for x in sys.argv[1:4])
ports = sys.argv[4:]
print(f'[[listeners]]\naddress = "127.0.0.1:{gw}"\n')
for u in range(ups):
    addrs = ", ".join(f'{{ address = "127.0.0.1:{p}" }}' for p in ports)
    print(f'[[upstreams]]\nname = "u{u}"\nendpoints = [{addrs}]\n')
for r in range(routes):
    print(f'[[routes]]\nid = "r{r}"\nupstream = "u{r % ups}"\npath = {{ prefix = "/r{r}/" }}\n')
PY
taskset -c 1 "$b" run --config "$out/gateway.toml" --threads 1 --metrics-listen "127.0.0.1:$metrics_port" \
  >> "$out/gateway.log" 2>&1 &
gw=$!
pids+=("$gw")
wait_port "$gw_port" 30
wait_metrics "$metrics_port"
# One request per route, so every route, upstream and endpoint has numbers to show.
for r in $(seq 0 $((routes - 1))); do echo "url = \"http://127.0.0.1:$gw_port/r$r/\""; done > "$out/curl.cfg"
taskset -c 0 curl -s -K "$out/curl.cfg" -o /dev/null --parallel --parallel-max 16 || true
sleep 2
: > "$out/json.txt"
for _ in $(seq "$samples"); do
  sleep 1.05
  taskset -c 0 curl -s -o "$out/status.json" -w '%{time_total} %{size_download}\n' \
    "http://127.0.0.1:$metrics_port/status.json" >> "$out/json.txt"
done
gz=$(curl -s -H 'Accept-Encoding: gzip' -o /dev/null -w '%{size_download}' "http://127.0.0.1:$metrics_port/status.json")
: > "$out/render.txt"
for i in 1 2 3; do
  profile=$(mktemp -d "$out/chromium.XXXXXX")
  # The page draws after its first fetch; --virtual-time-budget lets it, then the DOM is
  # dumped with the page's own render measure on <body>.
  taskset -c 0 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --window-size=1280,1000 --virtual-time-budget=5000 --dump-dom \
    "http://127.0.0.1:$metrics_port/status" 2>/dev/null > "$out/dom-$i.html" || true
  rm -rf "$profile"
  python3 - "$out/dom-$i.html" >> "$out/render.txt" <<'PY'
import re, sys
body = open(sys.argv[1]).read()
render = re.search(r'data-render-ms="([0-9.]+)"', body)
first = re.search(r'data-first-render-at="([0-9.]+)"', body)
rows = body.count("data-route=")
print(f"{render.group(1) if render else 'none'} {first.group(1) if first else 'none'} {rows}")
PY
done
python3 - "$out" "$routes" "$upstreams" "$endpoints" "$gz" <<'PY' | tee "$out/summary.txt"
import statistics, sys
out, routes, ups, eps, gz = sys.argv[1:]
t = [line.split() for line in open(f"{out}/json.txt") if line.strip()]
ms = sorted(float(a) * 1000 for a, _ in t)
size = int(t[-1][1])
print(f"{routes} routes, {ups} upstreams x {eps} endpoints")
print(f"/status.json: {size} bytes ({gz} gzipped); served in (ms, {len(ms)} requests 1 s apart): "
      f"min {ms[0]:.1f}  median {statistics.median(ms):.1f}  max {ms[-1]:.1f}")
for line in open(f"{out}/render.txt"):
    render, first, rows = line.split()
    print(f"Chromium: first draw took {render} ms, done {first} ms after navigation, {rows} route rows")
PY
echo "raw: $out"
