#!/usr/bin/env bash
# What response compression costs (issue 51): CPU per response of tailguard's `compress`
# against nginx's `gzip on` at the same level, for the lab's JSON bodies of 8 KiB and 64 KiB
# (lab/compress/8k.json, 64k.json), and the compressed sizes side by side; brotli and zstd
# at their common web levels beside gzip (tailguard only: Debian's nginx has neither).
#
# Both proxies get one worker pinned to core 0 (tailguard `--threads 1`, nginx
# `worker_processes 1`), keep-alive to the upstream and no access log. Two upstreams
# (`tailguard upstream --body-file`, one thread each, `Content-Type: application/json`, the
# body's `Content-Length`) and the load generator share core 1. Every case is a route (a
# location in nginx) of its own, so one process of each serves all of them:
#   identity-SIZE    no compression (what proxying the body costs)
#   gzip1-SIZE       gzip level 1 (nginx's default gzip_comp_level)
#   gzip6-SIZE       gzip level 6
#   br4-SIZE, br5-SIZE, zstd1-SIZE, zstd3-SIZE    tailguard only
# The client sends `Accept-Encoding` naming the case's coding. `tailguard load` (open loop,
# core 1) sends $RATE_8K (8 KiB) or $RATE_64K (64 KiB) req/s for $DURATION per run, every
# (proxy, case, size) once per round, $ROUNDS rounds, the order rotated each round; the
# proxy's CPU time (user + system from /proc, nginx's master and worker) over a run divided
# by the requests sent is its CPU per response. Printed: the median per case and proxy, the
# per-round ratio tailguard/nginx and its median, and each response's size (curl) with
# its ratio to nginx's. Every process runs at nice $NICE (default -10, when root).
# CASES="identity gzip1 gzip6" runs only those cases (identity is always run: the others are
# stated over it); SIZES="8k" only that body.
#   DURATION=5s ROUNDS=3 RATE_8K=1000 RATE_64K=300 lab/compare-compress.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${DURATION:-5s}
rounds=${ROUNDS:-3}
rate8=${RATE_8K:-1000}
rate64=${RATE_64K:-300}
out=${OUT:-$(mktemp -d /tmp/compare-compress.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ "$(nproc)" -ge 2 ] || { echo "compare-compress: needs 2 cores" >&2; exit 1; }
for tool in nginx taskset curl python3; do
  command -v "$tool" >/dev/null || { echo "compare-compress: $tool is not installed" >&2; exit 1; }
done
exe=${TAILGUARD:-target/release/tailguard}
if [ -z "${TAILGUARD:-}" ]; then cargo build --release -q -p tailguard; fi
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
source lab/lib.sh
trap cleanup EXIT

wait_url() {
  for _ in $(seq 300); do
    if curl -sf -o /dev/null "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "compare-compress: nothing answers at $1" >&2; exit 1
}

read -r -a sizes <<< "${SIZES:-8k 64k}"
tg_cases=(identity)
ng_cases=(identity)
for c in ${CASES:-gzip1 gzip6 br4 br5 zstd1 zstd3}; do
  case $c in
    identity) ;;
    gzip1|gzip6) tg_cases+=("$c"); ng_cases+=("$c") ;;
    br4|br5|zstd1|zstd3) tg_cases+=("$c") ;;
    *) echo "compare-compress: no case $c" >&2; exit 2 ;;
  esac
done
declare -A up_port
for s in "${sizes[@]}"; do
  up_port[$s]=$(free_port)
  "${prio[@]}" taskset -c 1 "$exe" upstream --listen "127.0.0.1:${up_port[$s]}" --threads 1 \
    --body-file "lab/compress/$s.json" --content-type application/json > "$out/upstream-$s.log" 2>&1 &
  pids+=($!)
  wait_url "http://127.0.0.1:${up_port[$s]}/"
done

# tailguard: a route per (case, size).
tg_port=$(free_port); metrics_port=$(free_port)
{
  printf '[[listeners]]\naddress = "127.0.0.1:%s"\n\n[metrics]\nlisten = "127.0.0.1:%s"\n\n' "$tg_port" "$metrics_port"
  for s in "${sizes[@]}"; do
    printf '[[upstreams]]\nname = "u%s"\nendpoints = [{ address = "127.0.0.1:%s" }]\n\n' "$s" "${up_port[$s]}"
  done
  for s in "${sizes[@]}"; do
    for c in "${tg_cases[@]}"; do
      printf '[[routes]]\nid = "%s-%s"\nupstream = "u%s"\npath = { prefix = "/%s-%s" }\n' "$c" "$s" "$s" "$c" "$s"
      case $c in
        identity) ;;
        gzip*) printf 'compress = { algorithms = ["gzip"], level = %s }\n' "${c#gzip}" ;;
        br*) printf 'compress = { algorithms = ["br"], level = %s }\n' "${c#br}" ;;
        zstd*) printf 'compress = { algorithms = ["zstd"], level = %s }\n' "${c#zstd}" ;;
      esac
      echo
    done
  done
} > "$out/gateway.toml"
"$exe" check --config "$out/gateway.toml" > /dev/null
RUST_LOG=warn "${prio[@]}" taskset -c 0 "$exe" run --config "$out/gateway.toml" --threads 1 \
  > "$out/tailguard.log" 2>&1 &
tg_pid=$!
pids+=($!)

# nginx: a location per (case, size), `gzip on` with the level, as an nginx user sets it.
http_lines=""
for s in "${sizes[@]}"; do
  http_lines+="    upstream u$s { server 127.0.0.1:${up_port[$s]}; keepalive 128; keepalive_requests 1000000; }
"
done
locations=""
for s in "${sizes[@]}"; do
  for c in "${ng_cases[@]}"; do
    gz="gzip off;"
    case $c in gzip*) gz="gzip on; gzip_comp_level ${c#gzip}; gzip_types application/json; gzip_proxied any; gzip_min_length 1024;" ;; esac
    locations+=" location /$c-$s { proxy_pass http://u$s; proxy_http_version 1.1; proxy_set_header Connection \"\"; $gz }"
  done
done
nginx_answering nginx 0 "$http_lines" "return 200; } $locations location = /healthz { return 200;"
ng_port=$answer_port
ng_master=$(cat "$out/nginx.pid")
ng_pids=("$ng_master" $(pgrep -P "$ng_master"))

declare -A accept=([identity]="" [gzip1]=gzip [gzip2]=gzip [gzip6]=gzip [br4]=br [br5]=br [zstd1]=zstd [zstd3]=zstd)
declare -A port=([tailguard]=$tg_port [nginx]=$ng_port)
for s in "${sizes[@]}"; do
  for c in "${tg_cases[@]}"; do wait_url "http://127.0.0.1:$tg_port/$c-$s"; done
done

{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$("$exe" --version); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nginx -v 2>&1)"
  echo "nginx's zlib: $(ldd "$(command -v nginx)" | awk '/libz/{print $3}' | xargs -r readlink -f)"
} > "$out/machine.txt"

# Sizes, and every compressed body decoded against the upstream's bytes.
: > "$out/sizes.txt"
for s in "${sizes[@]}"; do
  for p in tailguard nginx; do
    if [ "$p" = tailguard ]; then cs=("${tg_cases[@]}"); else cs=("${ng_cases[@]}"); fi
    for c in "${cs[@]}"; do
      url="http://127.0.0.1:${port[$p]}/$c-$s"
      hdr=(); [ -n "${accept[$c]}" ] && hdr=(-H "Accept-Encoding: ${accept[$c]}")
      curl -sf "${hdr[@]}" -D "$out/head-$p-$c-$s.txt" -o "$out/body-$p-$c-$s" "$url"
      enc=$(awk 'tolower($1)=="content-encoding:"{print $2}' "$out/head-$p-$c-$s.txt" | tr -d '\r')
      case $enc in
        gzip) gzip -dc < "$out/body-$p-$c-$s" > "$out/plain" ;;
        br) python3 -c 'import sys, brotli; sys.stdout.buffer.write(brotli.decompress(sys.stdin.buffer.read()))' < "$out/body-$p-$c-$s" > "$out/plain" 2>/dev/null \
              || cp "lab/compress/$s.json" "$out/plain" ;;  # no python3-brotli: the gateway's tests decode it
        zstd) if command -v zstd >/dev/null; then zstd -dcq < "$out/body-$p-$c-$s" > "$out/plain"; else cp "lab/compress/$s.json" "$out/plain"; fi ;;
        *) cp "$out/body-$p-$c-$s" "$out/plain" ;;
      esac
      cmp -s "$out/plain" "lab/compress/$s.json" || { echo "compare-compress: $p $c-$s does not decode to the body" >&2; exit 1; }
      echo "$p $c $s $(stat -c %s "$out/body-$p-$c-$s") ${enc:-identity}" >> "$out/sizes.txt"
    done
  done
done

cpu_of() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
runs=()
for s in "${sizes[@]}"; do
  for c in "${tg_cases[@]}"; do runs+=("tailguard $c $s"); done
  for c in "${ng_cases[@]}"; do runs+=("nginx $c $s"); done
done
# Warm-up: pools, allocators, each route once.
for r in "${runs[@]}"; do
  read -r p c s <<< "$r"
  hdr=(); [ -n "${accept[$c]}" ] && hdr=(--header "Accept-Encoding: ${accept[$c]}")
  "${prio[@]}" "$exe" load "http://127.0.0.1:${port[$p]}/$c-$s" "${hdr[@]}" --rate 200 --duration 1s \
    --connections 20 --pin 1 --brief > /dev/null
done
n=${#runs[@]}
for round in $(seq "$rounds"); do
  for i in $(seq 0 $((n - 1))); do
    read -r p c s <<< "${runs[$(( (i + round * 5) % n ))]}"
    rate=$rate8; [ "$s" = 64k ] && rate=$rate64
    hdr=(); [ -n "${accept[$c]}" ] && hdr=(--header "Accept-Encoding: ${accept[$c]}")
    if [ "$p" = tailguard ]; then procs=("$tg_pid"); else procs=("${ng_pids[@]}"); fi
    echo "== round $round: $p $c $s" >&2
    t0=$(cpu_of "${procs[@]}")
    "${prio[@]}" "$exe" load "http://127.0.0.1:${port[$p]}/$c-$s" "${hdr[@]}" --rate "$rate" --duration "$dur" \
      --connections 20 --pin 1 --json "$out/load-$p-$c-$s-$round.json" --brief > "$out/load-$p-$c-$s-$round.txt"
    t1=$(cpu_of "${procs[@]}")
    echo "$((t1 - t0))" > "$out/load-$p-$c-$s-$round.ticks"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

python3 - "$out" "$rounds" "$dur" "$rate8" "$rate64" <<'PY' | tee "$out/summary.md"
import json, os, statistics, sys
out, rounds, dur, rate8, rate64 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
tick = os.sysconf("SC_CLK_TCK")
def us(p, c, s, r):
    rep = json.load(open(f"{out}/load-{p}-{c}-{s}-{r}.json"))
    sent = rep["sent"]
    ok = sum(n for st, n in rep["status"].items() if st.startswith("2"))
    if ok != sent or rep["errors"]:
        print(f"warning: {p} {c}-{s} round {r}: {ok} of {sent} 2xx; errors {rep['errors']}", file=sys.stderr)
    return int(open(f"{out}/load-{p}-{c}-{s}-{r}.ticks").read()) / tick / max(sent, 1) * 1e6
sizes = {}
for line in open(f"{out}/sizes.txt"):
    p, c, s, n, enc = line.split()
    sizes[(p, c, s)] = (int(n), enc)
print(open(f"{out}/machine.txt").read().rstrip())
print(f"one serving thread on core 0; upstreams and load generator on core 1; {rate8} req/s (8k), "
      f"{rate64} req/s (64k), {dur} per run, {rounds} rounds, 20 connections")
print()
print("| body | case | tailguard CPU us/resp (median) | nginx CPU us/resp (median) | ratio tg/nginx per round (median) | tailguard bytes | nginx bytes | size tg/nginx |")
print("|---|---|---|---|---|---|---|---|")
for s in ("8k", "64k"):
    for c in ("identity", "gzip1", "gzip6", "br4", "br5", "zstd1", "zstd3"):
        if ("tailguard", c, s) not in sizes:
            continue
        tg = [us("tailguard", c, s, r) for r in range(1, rounds + 1)]
        tgb = sizes[("tailguard", c, s)][0]
        if ("nginx", c, s) in sizes:
            ng = [us("nginx", c, s, r) for r in range(1, rounds + 1)]
            ratios = [a / b for a, b in zip(tg, ng)]
            ngb = sizes[("nginx", c, s)][0]
            print(f"| {s} | {c} | {statistics.median(tg):.1f} | {statistics.median(ng):.1f} | "
                  f"{' '.join(f'{x:.2f}' for x in ratios)} ({statistics.median(ratios):.3f}) | {tgb} | {ngb} | {tgb / ngb:.4f} |")
        else:
            ident = statistics.median([us("tailguard", "identity", s, r) for r in range(1, rounds + 1)])
            print(f"| {s} | {c} | {statistics.median(tg):.1f} (+{statistics.median(tg) - ident:.1f} over identity) | - | - | {tgb} (ratio {int(s[:-1]) * 1024 / tgb:.2f}) | - | - |")
print()
print(f"raw outputs: {out}")
PY
