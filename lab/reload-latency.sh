#!/usr/bin/env bash
# A reload of a large route table under load (issue 46): the latency of the requests that
# overlap a SIGHUP, for one or two gateway binaries side by side (A and B, e.g. before and
# after a change), rounds interleaved, a fresh process per run.
#
# Topology (2 cores): the gateway (one serving thread) pinned to core 1; `tailguard load`
# (open loop, $RATE req/s, 32 keep-alive connections) and the upstream (nginx, one worker)
# on core 0. The table is `tailguard lab routes`' ($ROUTES path routes, half prefixes, half
# exact, a tenth as many host routes); the load goes to the prefix route in the middle. Each
# run: the load for $DURATION s, with SIGHUP (the same file) $AT s in; the load's P50, P99,
# P99.9 and P100 over the whole run and the reload's time (SIGHUP to the `reloaded` line).
# HUP=0 runs the same without the SIGHUP (the baseline of the machine).
#   A=target/release/tailguard B=/tmp/old/tailguard ROUTES=100000 ROUNDS=3 lab/reload-latency.sh
set -euo pipefail
cd "$(dirname "$0")/.."
a=${A:-target/release/tailguard}
b=${B:-}
routes=${ROUTES:-100000}
rate=${RATE:-5000}
dur=${DURATION:-10}
at=${AT:-3}
rounds=${ROUNDS:-3}
out=${OUT:-$(mktemp -d /tmp/reload-latency.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "reload-latency: $tool is not installed" >&2; exit 1; }
done
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT
start_origin 0
gw_port=$(free_port)
python3 - "$routes" "$gw_port" "$up_port" > "$out/gateway.toml" <<'PY'
import sys
n, gw, up = (int(x) for x in sys.argv[1:4])
parts = [f'[[listeners]]\naddress = "127.0.0.1:{gw}"\n\n[[upstreams]]\nname = "u"\n'
         f'endpoints = [{{ address = "127.0.0.1:{up}" }}]\n']
for i in range(n):
    path = f'prefix = "/t{i}/api"' if i % 2 == 0 else f'exact = "/t{i}/x"'
    parts.append(f'\n[[routes]]\nid = "r{i}"\nupstream = "u"\npath = {{ {path} }}\n')
for j in range(n // 10):
    parts.append(f'\n[[routes]]\nid = "h{j}"\nupstream = "u"\nhost = "h{j}.example.com"\n')
print("".join(parts))
PY
target="http://127.0.0.1:$gw_port/t$(( (routes / 2) & ~1 ))/api/items"

run_one() { # name binary round
  local log=$out/gateway-$1-$3.log
  "${prio[@]}" taskset -c 1 "$2" run --config "$out/gateway.toml" --threads 1 \
    --metrics-listen off > "$log" 2>&1 &
  local gw=$!
  pids+=("$gw")
  for _ in $(seq 1200); do curl -fs -o /dev/null "$target" && break; sleep 0.05; done
  "${prio[@]}" "$2" load "$target" --rate "$rate" --duration "${dur}s" --connections 32 \
    --pin 0 --brief --hgrm "$out/load-$1-$3.hgrm" > "$out/load-$1-$3.txt" 2>&1 &
  local load=$!
  sleep "$at"
  local sent
  sent=$(date +%s.%N)
  local took=none
  # HUP=0: the same run without the reload, for the baseline.
  if [ "${HUP:-1}" = 1 ]; then kill -HUP "$gw"; fi
  for _ in $(seq "$([ "${HUP:-1}" = 1 ] && echo 1200 || echo 0)"); do
    if grep -q 'reloaded' "$log"; then took=$(python3 -c "import time; print(f'{time.time() - $sent:.2f}')"); break; fi
    sleep 0.05
  done
  wait "$load" || true
  kill "$gw"; wait "$gw" 2>/dev/null || true
  echo "$3 $1 $took" >> "$out/rounds.txt"
}

: > "$out/rounds.txt"
for r in $(seq "$rounds"); do
  if [ -n "$b" ] && [ $(( r % 2 )) -eq 0 ]; then
    run_one B "$b" "$r"; run_one A "$a" "$r"
  else
    run_one A "$a" "$r"; if [ -n "$b" ]; then run_one B "$b" "$r"; fi
  fi
done

python3 - "$out" "$rate" "$routes" <<'PY' | tee "$out/summary.txt"
import sys
out, rate, routes = sys.argv[1:]
sys.path.insert(0, "lab")  # lab/hgrm.py (the scripts run from the repository's root)
from hgrm import hgrm
print(f"{routes} path routes (+{int(routes)//10} host routes), {rate} req/s, SIGHUP during each run")
print("round name  reload_s   P50 ms   P99 ms  P99.9 ms  P100 ms")
for line in open(f"{out}/rounds.txt"):
    r, name, took = line.split()
    p50, p99, p999, p100 = hgrm(f"{out}/load-{name}-{r}.hgrm")
    print(f"{r:>5} {name:>4} {took:>9} {p50:>8.2f} {p99:>8.2f} {p999:>9.2f} {p100:>8.2f}")
PY
echo "raw: $out"
