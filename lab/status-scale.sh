#!/usr/bin/env bash
# The status page at scale (issue 48): 1,000 routes and 100 upstreams of 10 endpoints, each
# route with traffic. Prints how long /status.json takes to serve (built on the exporter
# thread: the registry read, the document, its JSON) and its size, and how long a headless
# Chromium takes to draw it (the page's own measures of its draws, read over WebDriver).
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
# Its first route, not `/` (which no route of this table matches: a 404).
for _ in $(seq 600); do curl -fs -o /dev/null "http://127.0.0.1:$gw_port/r0/" && break; sleep 0.05; done
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
# Chromium in real time, driven over WebDriver (chromedriver, as the browser tests do): the
# page's own measures of its last draw (`data-render-ms`) and of its first draw after the
# navigation (`data-first-render-at`), read after it drew three updates. (`--dump-dom` with a
# virtual time budget reads 0 ms: virtual time stands still while the page computes.)
for i in 1 2 3; do
  taskset -c 0 python3 - "http://127.0.0.1:$metrics_port/status" >> "$out/render.txt" <<'PY'
import json, subprocess, sys, tempfile, time, urllib.request
page = sys.argv[1]
driver = subprocess.Popen(["chromedriver", "--port=0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
port = None
for line in driver.stdout:
    if "started successfully on port " in line:
        port = int(line.split("started successfully on port ")[1].strip().rstrip("."))
        break
def call(method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["value"]
profile = tempfile.mkdtemp()
try:
    session = call("POST", "/session", {"capabilities": {"alwaysMatch": {"browserName": "chrome",
        "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": ["--headless", "--no-sandbox",
        "--disable-gpu", "--disable-quic", "--no-first-run", "--window-size=1280,1000",
        f"--user-data-dir={profile}"]}}}})["sessionId"]
    call("POST", f"/session/{session}/url", {"url": page})
    read = "const d = document.body.dataset; return [d.updates || '0', d.renderMs || 'none', d.firstRenderAt || 'none', String(document.querySelectorAll('[data-route]').length)];"
    for _ in range(600):
        updates, render, first, rows = call("POST", f"/session/{session}/execute/sync", {"script": read, "args": []})
        if int(updates) >= 3:
            break
        time.sleep(0.1)
    print(render, first, rows)
    call("DELETE", f"/session/{session}")
finally:
    driver.kill()
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
    print(f"Chromium: the third update drew in {render} ms; the first was drawn {first} ms after navigation; {rows} route rows")
PY
echo "raw: $out"
