#!/usr/bin/env bash
# A flood of wrong basic-auth passwords on one route against another route's latency
# (issue 47: "10x a route's capacity of wrong basic-auth passwords: another route's admitted
# P99 within 1.1x of its value without that flood").
#
# Topology (2 cores): the gateway, one serving thread, pinned to core 1 with its bcrypt pool
# (one thread at nice 19, queue 32; the gateway's threads all inherit the pin); the origin
# (nginx, one worker) and both load generators on core 0. Routes: `/open/` (no auth) and
# `/guarded/` (`type = "basic"`, an htpasswd file written by `htpasswd -B` at cost $COST).
# Each round runs two conditions, the order alternating: `quiet` (only $RATE req/s on
# `/open/`) and `flood` (the same, plus $FLOOD req/s of a wrong password on `/guarded/`:
# only successes are remembered, so each is a check or a full queue's 503), each for
# $WARMUP + $DURATION, a fresh gateway each time. $FLOOD defaults to 10x the pool's measured capacity at this cost (printed).
# Printed: each round's P50/P99/P99.9/P100 of `/open/` per condition, the flood's statuses,
# and the median P99 ratio flood/quiet.
#   [RATE=2000] [ROUNDS=3] [DURATION=20] [COST=5] [FLOOD=...] lab/keep-awake.sh lab/basic-flood.sh
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
rate=${RATE:-2000}
dur=${DURATION:-20}
warm=${WARMUP:-3}
rounds=${ROUNDS:-3}
cost=${COST:-5}
out=${OUT:-$(mktemp -d /tmp/basic-flood.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl htpasswd; do
  command -v "$tool" >/dev/null || { echo "basic-flood: $tool is not installed" >&2; exit 1; }
done
[ -x "$b" ] || { echo "basic-flood: $b is not executable" >&2; exit 1; }
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT

start_origin 0
htpasswd -cbB -C "$cost" "$out/users.htpasswd" alice 'correct horse' 2>/dev/null
cat > "$out/gateway.toml" <<EOF
[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "origin"
endpoints = [{ address = "127.0.0.1:$up_port" }]

[[auth]]
name = "staff"
type = "basic"
htpasswd = "$out/users.htpasswd"
realm = "staff"
workers = 1
queue = 32

[[routes]]
id = "guarded"
upstream = "origin"
path = { prefix = "/guarded/" }
auth = "staff"

[[routes]]
id = "open"
upstream = "origin"
path = { prefix = "/open/" }

[[routes]]
id = "rest"
upstream = "origin"
EOF

# The pool's capacity: wrong passwords one at a time, for 3 s, on a quiet gateway.
start_tailguard "$b"
capacity=$(python3 - "$gw_port" <<'EOF_PY'
import base64, http.client, sys, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < 3:
    auth = base64.b64encode(f"alice:wrong-{n}".encode()).decode()
    c.request("GET", "/guarded/", headers={"Authorization": "Basic " + auth})
    r = c.getresponse(); r.read()
    assert r.status == 401, r.status
    n += 1
print(int(n / (time.monotonic() - t0)))
EOF_PY
)
kill "$gw_pid"; wait "$gw_pid" 2>/dev/null || true
flood=${FLOOD:-$(( capacity * 10 ))}
echo "bcrypt cost $cost: the pool checks $capacity wrong passwords/s one at a time; flood: $flood req/s"

# One wrong password, sent again and again: only successes are remembered, so each request
# still costs a check on the pool, or a full queue's 503.
flood_args=(-H "Authorization: Basic $(printf 'alice:wrong' | base64)")

run() { # condition round
  start_tailguard "$b"
  local fpid=""
  if [ "$1" = flood ]; then
    "${prio[@]}" "$b" load "http://127.0.0.1:$gw_port/guarded/" --rate "$flood" \
      --duration "$((dur + warm + 1))s" --connections 64 --pin 0 "${flood_args[@]}" \
      --json "$out/$1-$2-flood.json" --brief > "$out/$1-$2-flood.txt" 2>&1 &
    fpid=$!
  fi
  "${prio[@]}" "$b" load "http://127.0.0.1:$gw_port/open/" --rate "$rate" --duration "${dur}s" \
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
