#!/usr/bin/env bash
# Instructions per request of the serving path, by condition of lab/compare-auth.sh: each
# condition's gateway (its config from a compare-auth run's output directory) under
# callgrind, one serving thread, `tailguard load` sending the condition's rotating header;
# counters zeroed after a warm-up, dumped after the measured requests (lab/callgrind.sh's
# method); `top-COND.txt` lists the heaviest functions (inclusive, per request) and
# `stage-COND.txt` those of the auth stage. Instruction counts do not depend on the machine
# being quiet, so they resolve differences of a percent that tick-sampled CPU time on a
# shared VM cannot. Valgrind hides SHA-NI from ring: SHA-256 counts are of its AVX code.
#   DIR=/tmp/compare-auth.XXXX [CONDITIONS="open-key key"] [REQUESTS=10000] [RATE=500] \
#     [B=tailguard] [LOAD=...] lab/auth/callgrind-auth.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
b=${B:-target/release/tailguard}
load=${LOAD:-$b}
dir=${DIR:?DIR is a lab/compare-auth.sh output directory (its configs and credentials)}
rate=${RATE:-500}
requests=${REQUESTS:-10000}
top=${TOP:-400}
conditions=(${CONDITIONS:-open-rs jwt-rs open-es jwt-es open-key key fwd-cache fwd})
out=${OUT:-$(mktemp -d /tmp/callgrind-auth.XXXXXX)}
prio=()
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
start_origin "0-$(($(nproc) - 1))"
nginx_answering authsvc "0-$(($(nproc) - 1))" "" 'return 200 "";'
header_of() {
  case $1 in
    open-es | jwt-es) echo "authorization: $dir/es256.tokens" ;;
    open-key | key) echo "x-api-key: $dir/api-keys" ;;
    *) echo "authorization: $dir/rs256.tokens" ;;
  esac
}
for c in "${conditions[@]}"; do
  gw_port=$(free_port)
  # The condition's config with this run's origin and auth service.
  sed -E -e "0,/address = \"127.0.0.1:[0-9]+\" \}/s//address = \"127.0.0.1:$up_port\" }/" \
    -e "s|http://127.0.0.1:[0-9]+/verify|http://127.0.0.1:$answer_port/verify|" \
    "$dir/$c.toml" > "$out/$c.toml"
  RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.$c.%p" \
    "$b" run --config "$out/$c.toml" --threads 1 --listen "127.0.0.1:$gw_port" \
    --metrics-listen 127.0.0.1:0 > "$out/gateway-$c.log" 2>&1 &
  gw=$!
  pids+=("$gw")
  for _ in $(seq 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$gw_port/")" != 000 ] && break
    sleep 0.05
  done
  h=$(header_of "$c")
  "$load" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration 3s --connections 32 \
    --brief --header-file "$h" > /dev/null
  callgrind_control --zero "$gw" > /dev/null
  secs=$(( (requests + rate - 1) / rate ))
  "$load" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${secs}s" --connections 32 \
    --brief --header-file "$h" --json "$out/load-$c.json" > "$out/load-$c.txt"
  callgrind_control --dump=measured "$gw" > /dev/null
  kill "$gw"; wait "$gw" 2>/dev/null || true
  n=$(python3 -c "import json; r=json.load(open('$out/load-$c.json')); assert set(r['status'])=={'200'}, r['status']; print(r['completed'])")
  dump=$(ls -t "$out"/callgrind."$c".*.* 2>/dev/null | grep -v '\.0$' | head -1 || true)
  [ -n "$dump" ] || dump=$(ls -t "$out"/callgrind."$c".* | head -1)
  total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1; exit}')
  echo "$c: $n requests, $((total / n)) instructions per request ($dump)" | tee -a "$out/summary.txt"
  callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null | python3 -c "
import re, sys
n = $n; k = 0
for line in sys.stdin:
    m = re.match(r'\s*([\d,]+) \([ \d.]+%\)\s+(.*)', line)
    if not m or 'PROGRAM TOTALS' in line: continue
    print(f'{int(m.group(1).replace(\",\", \"\")) / n:10.0f}  {m.group(2)[:160]}')
    k += 1
    if k >= $top: break
sys.stdin.read()" > "$out/top-$c.txt"
  # The auth stage and what it calls (the top of the inclusive list is the runtime's frames).
  grep -E "tailguard_auth|ring::|hyper_util::client" "$out/top-$c.txt" > "$out/stage-$c.txt" || true
done
echo "raw: $out"
