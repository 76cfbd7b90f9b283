#!/usr/bin/env bash
# What tracing costs the requests (issue 24's figures), measured the way compare-builds.sh
# measures a change: CPU per request at a fixed rate from the serving process's utime +
# stime, conditions interleaved round by round, a fresh server process for every run.
#
#   lab/compare-trace.sh cpu       gateway CPU/request at $CPU_RATE (15000) req/s: tracing
#                                  off, on (100 % sampled), on at 1 %, off beside a
#                                  Jaeger fed the same spans/s by another client (`fed`,
#                                  the control for what Jaeger's work on core 0 does to
#                                  the gateway's kernel time), and on (100 %) exporting to
#                                  an OTLP sink that ingests every span (`sink`); $ROUNDS
#                                  rounds. Each traced run's counters are in
#                                  trace-metrics.txt: Jaeger, sharing core 0 with the load
#                                  and the origin, may not keep up, and a span dropped
#                                  costs less than one exported.
#   lab/compare-trace.sh caddy     Caddy's CPU/request at $CADDY_RATE (5000) req/s: its
#                                  `tracing` directive off vs on (every request sampled,
#                                  OTLP/gRPC to the same Jaeger); $ROUNDS rounds
#   lab/compare-trace.sh latency   P50/P99/P99.9/P100 at $LAT_RATE (2000) req/s: off, on,
#                                  on with the collector down, and off beside a Jaeger fed
#                                  the same spans/s (`fed`); $LAT_ROUNDS rounds
#   lab/compare-trace.sh rss       the gateway's RSS every second for $RSS_DURATION (60) s at
#                                  $RSS_RATE (10000) req/s with the collector down
#   lab/compare-trace.sh all       all four
#
# Topology (2 cores): the server under test (the gateway with one serving thread, or Caddy)
# alone on core 1; `tailguard load` (open loop, $CONNECTIONS keep-alive connections), the
# upstream (nginx, one worker, a 13-byte body) and Jaeger v2 (the collector, memory storage,
# its own all-in-one defaults on free ports) share core 0: "exporting to Jaeger on the
# other core". The gateway's exporter thread is part of the gateway's process and is
# counted in its CPU, as it should be. Metrics on, access log off, as in compare-builds.sh.
# Every process runs at nice $NICE (default -10, when root). Raw outputs go to $OUT;
# summary.md there has every round. Tools: nginx, taskset, python3, curl;
# $HOME/go/bin/jaeger and (for `caddy`) $HOME/go/bin/caddy from scripts/install-tools
# (TAILGUARD_LAB_TOOLS=1 for Caddy).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in cpu|caddy|latency|rss|all) ;; *)
  echo "usage: lab/compare-trace.sh [cpu|caddy|latency|rss|all]" >&2; exit 2 ;;
esac
tg=${TG:-target/release/tailguard}
jaeger=${JAEGER:-$HOME/go/bin/jaeger}
caddy=${CADDY:-$HOME/go/bin/caddy}
rounds=${ROUNDS:-4}
dur=${DURATION:-15}
warm=${WARMUP:-3}
conns=${CONNECTIONS:-32}
cpu_rate=${CPU_RATE:-15000}
caddy_rate=${CADDY_RATE:-5000}
lat_rate=${LAT_RATE:-2000}
lat_dur=${LAT_DURATION:-30}
lat_rounds=${LAT_ROUNDS:-2}
rss_rate=${RSS_RATE:-10000}
rss_dur=${RSS_DURATION:-60}
out=${OUT:-$(mktemp -d /tmp/compare-trace.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "compare-trace: $tool is not installed" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "compare-trace: needs 2 cores" >&2; exit 1; }
[ -x "$tg" ] || { echo "compare-trace: $tg is not executable (cargo build --release -p tailguard)" >&2; exit 1; }
[ -x "$jaeger" ] || { echo "compare-trace: $jaeger is missing: run scripts/install-tools" >&2; exit 1; }
if [ "$what" = caddy ] || [ "$what" = all ]; then
  [ -x "$caddy" ] || { echo "compare-trace: $caddy is missing: TAILGUARD_LAB_TOOLS=1 scripts/install-tools" >&2; exit 1; }
fi
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
wait_http() { # url -> waits until it answers (any status)
  for _ in $(seq 400); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done
  echo "compare-trace: nothing answers at $1" >&2; exit 1
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "kernel: $(uname -sr)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "memory: $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
  echo "tailguard: $("$tg" --version 2>&1 | head -1) ($tg)"
  echo "jaeger: $(go version -m "$jaeger" 2>/dev/null | awk '$2 == "github.com/jaegertracing/jaeger" {print $3; exit}')"
  [ -x "$caddy" ] && echo "caddy: $(go version -m "$caddy" 2>/dev/null | awk '$2 == "github.com/caddyserver/caddy/v2" {print $3; exit}')"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt" 2>/dev/null || true
export PATH="$PATH:/usr/local/go/bin"

# The upstream: nginx, one worker on core 0, a fixed 13-byte answer.
start_origin 0

# Jaeger v2 with its all-in-one defaults (memory storage, the batch processor, OTLP over gRPC
# and HTTP) on free ports, on core 0; its own metrics off (they would take the fixed port
# 8888). It keeps the last 100,000 traces, as its default does.
j_grpc=$(free_port); j_http=$(free_port); j_query=$(free_port); j_qgrpc=$(free_port); j_health=$(free_port)
cat > "$out/jaeger.yaml" <<EOF
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_query:
    storage:
      traces: some_storage
    enable_tracing: false
    http:
      endpoint: "127.0.0.1:$j_query"
    grpc:
      endpoint: "127.0.0.1:$j_qgrpc"
  jaeger_storage:
    backends:
      some_storage:
        memory:
          max_traces: 100000
  healthcheckv2:
    use_v2: true
    http:
      endpoint: "127.0.0.1:$j_health"
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: "127.0.0.1:$j_grpc"
      http:
        endpoint: "127.0.0.1:$j_http"
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: some_storage
EOF
"${prio[@]}" taskset -c 0 "$jaeger" --config "$out/jaeger.yaml" > "$out/jaeger.log" 2>&1 &
pids+=($!)
for _ in $(seq 400); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$j_health/status")" = 200 ] && break
  sleep 0.05
done
wait_http "http://127.0.0.1:$j_query/api/services"
# Where nothing listens: the collector is down (connections refused at once).
down_port=$(free_port)
# A collector that ingests every span and keeps none (lab/lib.sh), on core 0.
start_otlp_sink 0

# The gateway's configs: the same route to the same upstream; tracing off, on (every request
# sampled), on at 1 %, and on towards the dead port.
base_config() { proxy_config; }
tracing_table() { # endpoint ratio
  printf '\n[tracing]\nendpoint = "%s"\nprotocol = "http/protobuf"\nsample_ratio = %s\n' "$1" "$2"
}
base_config > "$out/gw-off.toml"
{ base_config; tracing_table "http://127.0.0.1:$j_http" 1.0; } > "$out/gw-on.toml"
{ base_config; tracing_table "http://127.0.0.1:$j_http" 0.01; } > "$out/gw-on1.toml"
{ base_config; tracing_table "http://127.0.0.1:$down_port" 1.0; } > "$out/gw-down.toml"
# Its queue rides out the moments the exporter gets no CPU, so no span is dropped.
{ base_config; tracing_table "http://127.0.0.1:$sink_port" 1.0; printf 'queue_max_spans = 65536\n'; } \
  > "$out/gw-sink.toml"
check_config() { # name: the gateway must accept it before a run is spent on it
  "$tg" check --config "$out/gw-$1.toml" > "$out/check-$1.txt" 2>&1 \
    || { echo "compare-trace: the gateway refuses gw-$1.toml:" >&2; cat "$out/check-$1.txt" >&2; exit 1; }
}

# Caddy: a reverse proxy to the same upstream; `tracing` on every request in the traced
# config. Its exporter reads the standard OTEL_* variables (OTLP over gRPC to Jaeger, every
# trace sampled).
caddyfile() { # port traced
  printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\nhttp://127.0.0.1:%s {\n' "$1"
  [ "$2" = 1 ] && printf '\ttracing {\n\t\tspan caddy\n\t}\n'
  printf '\treverse_proxy 127.0.0.1:%s\n}\n' "$up_port"
}

start_server() { # kind(gateway-off|gateway-on|...|caddy-off|caddy-on) [req/s a `fed` Jaeger is fed for] -> srv_pid srv_port srv_metrics
  srv_port=$(free_port)
  srv_metrics=""
  case "$1" in
    gateway-fed)
      srv_metrics=$(free_port)
      "${prio[@]}" taskset -c 1 "$tg" run --config "$out/gw-off.toml" --threads 1 \
        --listen "127.0.0.1:$srv_port" --metrics-listen "127.0.0.1:$srv_metrics" \
        >> "$out/gateway-fed.log" 2>&1 &
      ;;
    gateway-*)
      check_config "${1#gateway-}"
      srv_metrics=$(free_port)
      "${prio[@]}" taskset -c 1 "$tg" run --config "$out/gw-${1#gateway-}.toml" --threads 1 \
        --listen "127.0.0.1:$srv_port" --metrics-listen "127.0.0.1:$srv_metrics" \
        >> "$out/gateway-${1#gateway-}.log" 2>&1 &
      ;;
    caddy-*)
      local traced=0; [ "$1" = caddy-on ] && traced=1
      caddyfile "$srv_port" "$traced" > "$out/Caddyfile-$1-$srv_port"
      OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$j_grpc" OTEL_EXPORTER_OTLP_PROTOCOL=grpc \
        OTEL_EXPORTER_OTLP_INSECURE=true OTEL_TRACES_SAMPLER=always_on \
        OTEL_SERVICE_NAME=caddy \
        "${prio[@]}" taskset -c 1 "$caddy" run --adapter caddyfile \
        --config "$out/Caddyfile-$1-$srv_port" >> "$out/$1.log" 2>&1 &
      ;;
  esac
  srv_pid=$!
  pids+=("$srv_pid")
  wait_http "http://127.0.0.1:$srv_port/"
  if [ "$1" = gateway-fed ]; then start_feeder $((2 * ${2:-$cpu_rate})); fi
}
stop_server() {
  kill "$srv_pid" 2>/dev/null || true; wait "$srv_pid" 2>/dev/null || true
  if [ -n "${feeder_pid:-}" ]; then
    kill "$feeder_pid" 2>/dev/null || true; wait "$feeder_pid" 2>/dev/null || true
    feeder_pid=""
  fi
}

# The `fed` control: one export request the traced gateway really sent (captured once),
# replayed to Jaeger with fresh trace and span ids at the span rate the traced gateway
# exports at $CPU_RATE (two spans per request), from core 0, while an untraced gateway
# serves. Jaeger then ingests as much on core 0 as beside the traced gateway.
capture_batch() {
  local cap_port cap_pid
  cap_port=$(free_port)
  python3 - "$cap_port" "$out/batch.bin" > "$out/capture.log" 2>&1 <<'PY' &
import http.server, sys
port, path = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            best = len(open(path, "rb").read())
        except OSError:
            best = 0
        if len(body) > best:
            open(path, "wb").write(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
PY
  cap_pid=$!
  pids+=("$cap_pid")
  wait_http "http://127.0.0.1:$cap_port/"
  { base_config; tracing_table "http://127.0.0.1:$cap_port" 1.0; printf 'batch_interval_ms = 100\n'; } > "$out/gw-capture.toml"
  start_server gateway-capture
  load 5000 2s > /dev/null 2>&1
  sleep 0.5
  stop_server
  kill "$cap_pid" 2>/dev/null || true; wait "$cap_pid" 2>/dev/null || true
  [ -s "$out/batch.bin" ] || { echo "compare-trace: captured no export request" >&2; exit 1; }
}
start_feeder() { # spans/s -> feeder_pid
  "${prio[@]}" taskset -c 0 python3 - "$out/batch.bin" "127.0.0.1:$j_http" "$1" "$((warm + dur + 5))" \
    >> "$out/feeder.log" 2>&1 <<'PY' &
import http.client, os, re, sys, time
body = open(sys.argv[1], "rb").read()
host, port = sys.argv[2].split(":")
per_s = float(sys.argv[3])
# Each span opens with its trace id (field 1, 16 bytes) then its span id (field 2, 8 bytes).
offs = [m.start() + 2 for m in re.finditer(rb"\x0a\x10(?=.{16}\x12\x08)", body, re.S)]
assert offs, "no spans found in the captured request"
every = len(offs) / per_s
# Every request's ids are made up front (while the warm-up runs), so that sending is all
# this process does on core 0 while the gateway is measured: its own work would add load
# the traced gateway's condition does not have.
n = int(float(sys.argv[4]) / every) + 1
bodies = []
for _ in range(n):
    b = bytearray(body)
    rnd = os.urandom(24 * len(offs))
    for i, o in enumerate(offs):
        b[o:o + 16] = rnd[24 * i:24 * i + 16]
        b[o + 18:o + 26] = rnd[24 * i + 16:24 * i + 24]
    bodies.append(bytes(b))
print(f"replaying {len(offs)} spans per request, every {every * 1000:.1f} ms, {n} requests", flush=True)
conn = http.client.HTTPConnection(host, int(port))
sent, start = 0, time.monotonic()
while True:
    conn.request("POST", "/v1/traces", bodies[sent % n], {"Content-Type": "application/x-protobuf"})
    conn.getresponse().read()
    sent += 1
    wait = start + sent * every - time.monotonic()
    if wait > 0:
        time.sleep(wait)
PY
  feeder_pid=$!
  pids+=("$feeder_pid")
}
load() { # rate duration json hgrm -> the load report
  "${prio[@]}" "$tg" load "http://127.0.0.1:$srv_port/" --rate "$1" --duration "$2" \
    --connections "$conns" --pin 0 --brief ${3:+--json "$3"} ${4:+--hgrm "$4"}
}
ticks=$(getconf CLK_TCK)
cpu_of() { awk '{print $14, $15}' "/proc/$1/stat"; }
dropped() { # the gateway's trace counters, from its /metrics
  curl -s "http://127.0.0.1:$srv_metrics/metrics" | grep -E '^tailguard_trace_(spans_(exported|dropped)_total|queue_spans|export_errors_total)' | tr '\n' ' ' || true
}

cpu_run() { # kind rate tag -> appends "tag kind round user_us sys_us completed" to cpu.txt
  local kind=$1 rate=$2 r=$3 before after
  start_server "$kind"
  load "$rate" "${warm}s" > /dev/null 2>&1
  before=$(cpu_of "$srv_pid")
  load "$rate" "${dur}s" "$out/load-$kind-$r.json" > "$out/load-$kind-$r.txt" 2>&1
  after=$(cpu_of "$srv_pid")
  [ -n "$srv_metrics" ] && echo "$kind $r $(dropped)" >> "$out/trace-metrics.txt"
  stop_server
  python3 - "$before" "$after" "$ticks" "$out/load-$kind-$r.json" "$kind" "$r" >> "$out/cpu.txt" <<'PY'
import json, sys
b = [int(x) for x in sys.argv[1].split()]
a = [int(x) for x in sys.argv[2].split()]
tck = int(sys.argv[3])
rep = json.load(open(sys.argv[4]))
done = rep["completed"]
bad = sum(n for code, n in rep["status"].items() if int(code) >= 400) + sum(rep["errors"].values())
print(f"{sys.argv[5]} {sys.argv[6]} {(a[0]-b[0])*1e6/tck/done:.3f} {(a[1]-b[1])*1e6/tck/done:.3f} {done} {bad}")
PY
}

interleaved() { # rate kind... : $rounds rounds, the order rotating each round
  local rate=$1; shift
  local kinds=("$@") n=$# r i
  for r in $(seq "$rounds"); do
    for i in $(seq 0 $((n - 1))); do
      cpu_run "${kinds[$(( (i + r - 1) % n ))]}" "$rate" "$r"
    done
  done
}

: > "$out/cpu.txt"
if [ "$what" = cpu ] || [ "$what" = all ]; then
  capture_batch
  interleaved "$cpu_rate" gateway-off gateway-on gateway-on1 gateway-fed gateway-sink
fi
if [ "$what" = caddy ] || [ "$what" = all ]; then
  interleaved "$caddy_rate" caddy-off caddy-on
fi

: > "$out/latency.txt"
if [ "$what" = latency ] || [ "$what" = all ]; then
  # `gateway-fed`: untraced, beside a Jaeger fed the spans the traced gateway would send
  # at this rate (the control of the CPU figure, here for the latency's).
  [ -s "$out/batch.bin" ] || capture_batch
  for r in $(seq "$lat_rounds"); do
    for kind in gateway-off gateway-on gateway-down gateway-fed; do
      start_server "$kind" "$lat_rate"
      load "$lat_rate" "${warm}s" > /dev/null 2>&1
      load "$lat_rate" "${lat_dur}s" "$out/lat-$kind-$r.json" "$out/lat-$kind-$r.hgrm" \
        > "$out/lat-$kind-$r.txt" 2>&1
      echo "$kind $r $(dropped)" >> "$out/trace-metrics.txt"
      stop_server
      echo "$kind $r" >> "$out/latency.txt"
    done
  done
fi

: > "$out/rss.txt"
if [ "$what" = rss ] || [ "$what" = all ]; then
  start_server gateway-down
  load "$rss_rate" "${warm}s" > /dev/null 2>&1
  load "$rss_rate" "${rss_dur}s" "$out/rss-load.json" > "$out/rss-load.txt" 2>&1 &
  loader=$!
  for s in $(seq 0 "$rss_dur"); do
    echo "$s $(awk '/VmRSS/ {print $2}' "/proc/$srv_pid/status") $(dropped)" >> "$out/rss.txt"
    sleep 1
  done
  wait "$loader" || true
  stop_server
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
# Proof that the traced runs exported: the services Jaeger has spans of.
echo "jaeger has spans of: $(curl -s "http://127.0.0.1:$j_query/api/services")" >> "$out/machine.txt"

python3 - "$out" "$dur" "$lat_dur" "$rss_rate" <<'PY' > "$out/summary.md"
import json, os, statistics, sys
out, dur, lat_dur, rss_rate = sys.argv[1:]
print("```"); print(open(f"{out}/machine.txt").read().rstrip()); print("```\n")
rows = {}
for line in open(f"{out}/cpu.txt"):
    kind, r, user, system, done, bad = line.split()
    rows.setdefault(kind, {})[int(r)] = (float(user), float(system), int(done), int(bad))
def table(base, others, title):
    if base not in rows:
        return
    print(f"## {title}\n")
    print(f"CPU per request of the serving process, microseconds (utime + stime over the {dur} s measured, / requests completed); ratios against `{base}` in the same round.\n")
    head = "| round | " + " | ".join(f"{k} user+sys = total (done, failed)" for k in [base] + others) + " | " + " | ".join(f"{k} / {base}" for k in others) + " |"
    print(head); print("|" + "---|" * (head.count("|") - 1))
    ratios = {k: [] for k in others}
    for r in sorted(rows[base]):
        cells = []
        for k in [base] + others:
            u, s, d, b = rows[k][r]
            cells.append(f"{u:.2f}+{s:.2f} = {u+s:.2f} ({d}, {b})")
        bt = sum(rows[base][r][:2])
        rs = []
        for k in others:
            x = sum(rows[k][r][:2]) / bt
            ratios[k].append(x); rs.append(f"{x:.3f}")
        print(f"| {r} | " + " | ".join(cells) + " | " + " | ".join(rs) + " |")
    print()
    for k in others:
        print(f"- median {k} / {base}: **{statistics.median(ratios[k]):.3f}** (rounds: {', '.join(f'{x:.3f}' for x in ratios[k])})")
    print()
table("gateway-off", ["gateway-on", "gateway-on1", "gateway-sink"], "Gateway: tracing off vs on (100 %, to Jaeger) vs on (1 %) vs on (100 %, to the sink)")
table("gateway-fed", ["gateway-on"], "Gateway: tracing on (100 %) vs off beside a Jaeger fed the same spans/s (the control)")
table("caddy-off", ["caddy-on"], "Caddy: tracing off vs on (every request, OTLP/gRPC)")

sys.path.insert(0, "lab")  # lab/hgrm.py (the scripts run from the repository's root)
from hgrm import hgrm
lat = [l.split() for l in open(f"{out}/latency.txt") if l.strip()]
if lat:
    print(f"## Latency at a fixed rate ({lat_dur} s measured per run), milliseconds from the intended send time\n")
    print("| round | condition | P50 | P99 | P99.9 | P100 | completed | failed |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, r in lat:
        p50, p99, p999, p100 = hgrm(f"{out}/lat-{kind}-{r}.hgrm")
        rep = json.load(open(f"{out}/lat-{kind}-{r}.json"))
        bad = sum(n for code, n in rep["status"].items() if int(code) >= 400) + sum(rep["errors"].values())
        print(f"| {r} | {kind} | {p50:.3f} | {p99:.3f} | {p999:.3f} | {p100:.3f} | {rep['completed']} | {bad} |")
    print()
rss = [l.split() for l in open(f"{out}/rss.txt") if l.strip()]
if rss:
    rep = json.load(open(f"{out}/rss-load.json"))
    bad = sum(n for code, n in rep["status"].items() if int(code) >= 400) + sum(rep["errors"].values())
    kb = [int(x[1]) for x in rss]
    print(f"## RSS with the collector down, {rss_rate} req/s\n")
    print(f"Completed {rep['completed']}, failed {bad}. RSS (kB) every second: first {kb[0]}, last {kb[-1]}, min {min(kb)}, max {max(kb)}; after 10 s: min {min(kb[10:] or kb)}, max {max(kb[10:] or kb)}.\n")
    print("```"); print(" ".join(str(k) for k in kb)); print("```\n")
    print(f"Trace counters at the end: {' '.join(rss[-1][2:])}\n")
PY
cat "$out/summary.md"
echo "raw: $out"
