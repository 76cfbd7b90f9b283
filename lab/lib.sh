# shellcheck shell=bash
# What the lab's comparison scripts share (sourced, not run): free ports, the children to
# stop on exit, and the nginx origin they all measure against. Callers set `out` (the output
# directory) and `prio` (an array prefix, e.g. `nice -n -10`, or empty) before calling.

# A free TCP port on 127.0.0.1 (the kernel's pick; released at once, used right after).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Every child started; `trap cleanup EXIT` stops them all.
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }

# nginx_answering NAME CPUS HTTP_LINES LOCATION: nginx, one worker pinned to CPUS, its access
# log off, keep-alive for a million requests, `HTTP_LINES` in its `http` block and
# `location / { LOCATION }`, config and logs under $out as NAME.*; sets `answer_port` and
# returns once it answers.
nginx_answering() {
  answer_port=$(free_port)
  mkdir -p "$out/$1-tmp"
  cat > "$out/$1.conf" <<EOF_NGINX
worker_processes 1;
daemon off;
pid $out/$1.pid;
error_log $out/$1-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $out/$1-tmp/cb; proxy_temp_path $out/$1-tmp/px;
    fastcgi_temp_path $out/$1-tmp/fc; uwsgi_temp_path $out/$1-tmp/uw;
    scgi_temp_path $out/$1-tmp/sc;
    keepalive_requests 1000000;
$3
    server { listen 127.0.0.1:$answer_port; location / { $4 } }
}
EOF_NGINX
  ${prio[@]+"${prio[@]}"} taskset -c "$2" nginx -c "$out/$1.conf" -p "$out" > "$out/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do curl -fs -o /dev/null "http://127.0.0.1:$answer_port/" && return 0; sleep 0.05; done
  echo "$(basename "$0"): nginx ($1) does not answer on port $answer_port ($out/$1-error.log)" >&2
  exit 1
}

# start_origin CPUS: nginx with one worker answering "hello, world\n" to everything, pinned to
# CPUS, its access log off; sets `up_port` and returns once it answers.
start_origin() {
  nginx_answering origin "$1" "" 'return 200 "hello, world\n";'
  up_port=$answer_port
}

# wait_port PORT: returns once http://127.0.0.1:PORT/ answers (10 s at most), else exits.
wait_port() { # port [seconds, default 10]
  for _ in $(seq $(( ${2:-10} * 20 ))); do
    curl -fs -o /dev/null "http://127.0.0.1:$1/" && return 0
    sleep 0.05
  done
  echo "$(basename "$0"): nothing answers on port $1" >&2
  exit 1
}

# extra_config: prints the TOML file $EXTRA_CONFIG names, if set, for a script to append to
# proxy_config's output (e.g. a `[tracing]` table), and with TRACE_SINK=1 a `[tracing]` table
# (every request sampled, or $TRACE_RATIO) exporting to the sink `start_otlp_sink` started,
# its queue $TRACE_QUEUE spans (default 8192, the gateway's): a larger one rides out the
# moments the exporter, at SCHED_IDLE on the serving core, gets no CPU (a burst of load, the
# profiler), so that no span is dropped while a cost is measured; $TRACE_BATCH spans a batch
# (default 2048, the gateway's).
extra_config() {
  if [ -n "${EXTRA_CONFIG:-}" ]; then cat "$EXTRA_CONFIG"; fi
  if [ "${TRACE_SINK:-0}" = 1 ]; then
    printf '\n[tracing]\nendpoint = "http://127.0.0.1:%s"\nprotocol = "http/protobuf"\nsample_ratio = %s\nqueue_max_spans = %s\nbatch_max_spans = %s\n' \
      "$sink_port" "${TRACE_RATIO:-1.0}" "${TRACE_QUEUE:-8192}" "${TRACE_BATCH:-2048}"
  fi
}

# start_otlp_sink CPUS: an OTLP/HTTP collector that reads every export request and answers
# 200 with an empty `ExportTraceServiceResponse` (nginx, one worker, pinned to CPUS); sets
# `sink_port`. It keeps nothing: it stands in for a collector with the CPU to ingest every
# span when the real one (Jaeger, beside the load generator and the origin on a shared core)
# cannot, so that a traced gateway's cost is measured with every span exported, none dropped.
start_otlp_sink() {
  nginx_answering sink "$1" \
    '    client_max_body_size 0; client_body_buffer_size 1m; keepalive_timeout 600s;' \
    'default_type application/x-protobuf; return 200 "";'
  sink_port=$answer_port
}

# trace_counters: the running gateway's trace counters (exported, dropped by reason, queue),
# on one line; empty when it has none.
trace_counters() {
  curl -s "http://127.0.0.1:$metrics_port/metrics" \
    | grep -E '^tailguard_trace_(spans_(exported|dropped)_total|queue_spans|export_errors_total)' \
    | tr '\n' ' ' || true
}

# start_tailguard EXE [ARGS...]: EXE on core 1 with one serving thread and $out/gateway.toml,
# listening on a free port (sets gw_port and gw_pid; logs to $out/gateway.log), metrics on a
# port of its own (sets metrics_port); ARGS follow `run`'s. Runs under "${prio[@]}" (empty for no nice).
start_tailguard() {
  local exe=$1
  shift
  gw_port=$(free_port)
  metrics_port=$(free_port)
  "${prio[@]}" taskset -c 1 "$exe" run --config "$out/gateway.toml" --threads 1 \
    --listen "127.0.0.1:$gw_port" --metrics-listen "127.0.0.1:$metrics_port" "$@" \
    >> "$out/gateway.log" 2>&1 &
  gw_pid=$!
  pids+=("$gw_pid")
  wait_port "$gw_port"
}

# proxy_config [ADDRESS [LISTENER_LINES]]: prints the gateway config the comparisons measure:
# one listener (ADDRESS, default 127.0.0.1:0 for one given on the command line; LINES follow
# its table: its own keys, e.g. its `tls`, or more `[[listeners]]`), every path to the origin
# (`start_origin` first).
proxy_config() {
  printf '[[listeners]]\naddress = "%s"\n' "${1:-127.0.0.1:0}"
  if [ -n "${2:-}" ]; then printf '%s\n' "$2"; fi
  cat <<EOF_PROXY

[[upstreams]]
name = "origin"
endpoints = [{ address = "127.0.0.1:$up_port" }]

[[routes]]
id = "all"
upstream = "origin"
path = { prefix = "/" }
EOF_PROXY
}
