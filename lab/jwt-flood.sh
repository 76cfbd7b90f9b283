#!/usr/bin/env bash
# A flood of invalid JWTs on one route against another route's latency (issue 47: "10x a
# route's capacity of invalid tokens: another route's admitted P99 within 1.1x of its value
# without that flood"), the method of lab/basic-flood.sh.
#
# Topology (2 cores): the gateway, one serving thread, pinned to core 1; the origin (nginx,
# one worker) and both load generators on core 0. Routes: `/open/` (no auth) and
# `/guarded/` (`type = "jwt"`, RS256, a JWKS file). The flood: $KIND tokens in rotation,
#   forged   1,000 distinct RS256 tokens with the key set's `kid` and valid claims, signed by
#            another key: each costs a full signature check (no cache holds a failure)
#   garbage  1,000 distinct `Bearer not-a-jwt-N`: refused by the parser
# The route's capacity for them: the serving thread's CPU per refused token, measured first
# at $PROBE req/s for 3 s (capacity = 1 s / that). $FLOOD defaults to 10x the capacity, but
# no more than $MAX_FLOOD (default 40,000 req/s: what one load generator on core 0 sends
# here); the script says when it capped. Each round runs `quiet` (only $RATE req/s on
# `/open/`) and `flood` (the same plus the flood), the order alternating, each for
# $WARMUP + $DURATION on a fresh gateway. Printed: each round's P50/P99/P99.9/P100 of
# `/open/` per condition, the statuses, and the median P99 ratio flood/quiet.
#   [RATE=2000] [ROUNDS=3] [DURATION=15] [KIND=forged] [FLOOD=...] [LOAD=...] \
#     lab/keep-awake.sh lab/jwt-flood.sh
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
load=${LOAD:-$b}
rate=${RATE:-2000}
dur=${DURATION:-15}
warm=${WARMUP:-3}
rounds=${ROUNDS:-3}
kind=${KIND:-forged}
probe=${PROBE:-5000}
max_flood=${MAX_FLOOD:-40000}
out=${OUT:-$(mktemp -d /tmp/jwt-flood.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "jwt-flood: $tool is not installed" >&2; exit 1; }
done
for exe in "$b" "$load"; do [ -x "$exe" ] || { echo "jwt-flood: $exe is not executable" >&2; exit 1; }; done
"$load" load --help | grep -q -- --header-file \
  || { echo "jwt-flood: $load load has no --header-file (set LOAD to a build that has)" >&2; exit 1; }
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT

python3 lab/auth/make-credentials.py "$out" 1000
case $kind in
  forged) tokens=$out/forged-rs256.tokens ;;
  garbage) tokens=$out/garbage.tokens; for i in $(seq 1000); do echo "Bearer not-a-jwt-$i"; done > "$tokens" ;;
  *) echo "jwt-flood: KIND is forged or garbage" >&2; exit 2 ;;
esac
start_origin 0
cat > "$out/gateway.toml" <<EOF
[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "origin"
endpoints = [{ address = "127.0.0.1:$up_port" }]

[[auth]]
name = "users"
type = "jwt"
jwks = "$out/jwks.json"
issuer = "https://idp.lab/"
audiences = ["lab-api"]
algorithms = ["RS256"]

[[routes]]
id = "guarded"
upstream = "origin"
path = { prefix = "/guarded/" }
auth = "users"

[[routes]]
id = "open"
upstream = "origin"
path = { prefix = "/open/" }

[[routes]]
id = "rest"
upstream = "origin"
EOF
"$b" check --config "$out/gateway.toml" > /dev/null

# The route's capacity for these tokens: the serving thread's CPU per refusal.
start_tailguard "$b"
cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }
"${prio[@]}" "$load" load "http://127.0.0.1:$gw_port/guarded/" --rate "$probe" --duration 1s \
  --connections 32 --pin 0 --brief --header-file "authorization: $tokens" > /dev/null 2>&1
before=$(cpu_of "$gw_pid")
"${prio[@]}" "$load" load "http://127.0.0.1:$gw_port/guarded/" --rate "$probe" --duration 3s \
  --connections 32 --pin 0 --brief --header-file "authorization: $tokens" \
  --json "$out/probe.json" > "$out/probe.txt" 2>&1
after=$(cpu_of "$gw_pid")
kill "$gw_pid"; wait "$gw_pid" 2>/dev/null || true
read -r us_per capacity < <(python3 - "$before" "$after" "$(getconf CLK_TCK)" "$out/probe.json" <<'EOF_PY'
import json, sys
rep = json.load(open(sys.argv[4]))
assert set(rep["status"]) == {"401"}, rep["status"]
us = (int(sys.argv[2]) - int(sys.argv[1])) * 1e6 / int(sys.argv[3]) / rep["completed"]
print(f"{us:.2f} {int(1e6 / us)}")
EOF_PY
)
flood=${FLOOD:-$(( capacity * 10 ))}
capped=""
if [ -z "${FLOOD:-}" ] && [ "$flood" -gt "$max_flood" ]; then
  capped=" (10x would be $flood: capped at MAX_FLOOD, what the generator sends here)"
  flood=$max_flood
fi
echo "$kind tokens: $us_per µs of the serving thread per refusal at $probe req/s: capacity $capacity req/s; flood: $flood req/s$capped"

run() { # condition round
  start_tailguard "$b"
  local fpid=""
  if [ "$1" = flood ]; then
    "${prio[@]}" "$load" load "http://127.0.0.1:$gw_port/guarded/" --rate "$flood" \
      --duration "$((dur + warm + 1))s" --connections 64 --pin 0 \
      --header-file "authorization: $tokens" \
      --json "$out/$1-$2-flood.json" --brief > "$out/$1-$2-flood.txt" 2>&1 &
    fpid=$!
  fi
  "${prio[@]}" "$load" load "http://127.0.0.1:$gw_port/open/" --rate "$rate" --duration "${dur}s" \
    --warmup "${warm}s" --connections 32 --pin 0 --hgrm "$out/$1-$2.hgrm" \
    --json "$out/$1-$2.json" > "$out/$1-$2.txt" 2>&1
  if [ -n "$fpid" ]; then wait "$fpid" || true; fi
  kill "$gw_pid"; wait "$gw_pid" 2>/dev/null || true
}

for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="quiet flood"; else order="flood quiet"; fi
  for c in $order; do run "$c" "$r"; done
done

python3 lab/flood-summary.py "$out" "$rounds"
echo "raw: $out"
