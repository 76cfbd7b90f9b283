#!/usr/bin/env bash
# What authentication costs the gateway per request (issue 47, "Cost"): CPU per request
# (user + system of the serving process) of one route without auth and the same route with
# each authenticator, at a fixed rate, rounds interleaved (the method of lab/compare-cpu.sh).
#
# Topology (2 cores): the gateway, one serving thread (nginx: one worker), pinned to core 1;
# `tailguard load` (open loop, $CONNECTIONS keep-alive connections), the origin (nginx, one
# worker, 13 bytes) and the auth service of forward auth (nginx, one worker, an empty 200)
# on core 0. Each condition is a fresh gateway with one route `/` and its own config:
#   open-rs   no auth, each request carrying one of 1,000 RS256 tokens (`Authorization`)
#   jwt-rs    type = "jwt", the same 1,000 valid RS256 tokens in rotation
#   open-es   no auth, 1,000 ES256 tokens     jwt-es   type = "jwt", those tokens
#   open-key  no auth, 1,000 API keys (`x-api-key`)   key   type = "api_key", 1,000 consumers
#   fwd-cache type = "forward", cache on `authorization` (ttl 30 s), the RS256 tokens
#   fwd       type = "forward", no cache: one call to the auth service per request
#   nginx-auth  nginx, one worker, `auth_request` to the same auth service (a subrequest per
#             request, keep-alive to it and to the origin), the RS256 tokens
# Every auth condition is compared with the no-auth condition carrying the same header
# (`open-rs` for jwt-rs, fwd-cache and fwd; `open-es`; `open-key`), and `fwd` with
# `nginx-auth`. Each run: $WARMUP at $RATE req/s (every token verified once and
# remembered: 1,000 tokens take 1/15 s at 15,000 req/s), then $DURATION measured; utime and
# stime of the serving process over the measured part divided by the requests completed.
# Every response must be a 200 (a refused request is cheaper than a served one): statuses
# are printed per run. Printed: each round's µs per request per condition, the ratios per
# round, and their medians against the issue's goals.
#   [RATE=15000] [ROUNDS=5] [DURATION=10] [WARMUP=2] [CONDITIONS="open-rs jwt-rs ..."] \
#     [B=tailguard] [LOAD=tailguard with --header-file] lab/compare-auth.sh
# B is the gateway measured; LOAD the binary whose `load` generates the requests (default
# B; it needs `load --header-file`).
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
load=${LOAD:-$b}
rate=${RATE:-15000}
dur=${DURATION:-10}
warm=${WARMUP:-2}
rounds=${ROUNDS:-5}
conns=${CONNECTIONS:-32}
conditions=(${CONDITIONS:-open-rs jwt-rs open-es jwt-es open-key key fwd-cache fwd nginx-auth})
out=${OUT:-$(mktemp -d /tmp/compare-auth.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in nginx taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "compare-auth: $tool is not installed" >&2; exit 1; }
done
python3 -c 'import cryptography' 2>/dev/null \
  || { echo "compare-auth: python3's cryptography is not installed (python3-cryptography)" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "compare-auth: needs 2 cores" >&2; exit 1; }
for exe in "$b" "$load"; do [ -x "$exe" ] || { echo "compare-auth: $exe is not executable" >&2; exit 1; }; done
"$load" load --help | grep -q -- --header-file \
  || { echo "compare-auth: $load load has no --header-file (set LOAD to a build that has)" >&2; exit 1; }
prio=()
if [ "$(id -u)" -eq 0 ]; then prio=(nice -n "${NICE:--10}"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap cleanup EXIT

python3 lab/auth/make-credentials.py "$out" 1000
start_origin 0
nginx_answering authsvc 0 "" 'return 200 "";'
auth_port=$answer_port

# A gateway that refuses `/` still answers: wait for any HTTP answer.
wait_http() {
  for _ in $(seq 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/")" != 000 ] && return 0
    sleep 0.05
  done
  echo "compare-auth: nothing answers on port $1" >&2
  exit 1
}

auth_of() { # condition -> the [[auth]] table and the route's `auth` line
  case $1 in
    jwt-rs | jwt-es)
      printf '[[auth]]\nname = "users"\ntype = "jwt"\njwks = "%s/jwks.json"\nissuer = "https://idp.lab/"\naudiences = ["lab-api"]\nalgorithms = ["%s"]\n\n' \
        "$out" "$([ "$1" = jwt-rs ] && echo RS256 || echo ES256)" ;;
    key)
      printf '[[auth]]\nname = "partners"\ntype = "api_key"\nkeys_file = "%s/keys.txt"\n\n' "$out" ;;
    fwd-cache | fwd)
      printf '[[auth]]\nname = "sso"\ntype = "forward"\nurl = "http://127.0.0.1:%s/verify"\nrequest_headers = ["authorization"]\n' "$auth_port"
      [ "$1" = fwd-cache ] && printf 'cache = { key_headers = ["authorization"], ttl_s = 30 }\n'
      printf '\n' ;;
  esac
}
route_auth() {
  case $1 in jwt-*) echo 'auth = "users"' ;; key) echo 'auth = "partners"' ;; fwd*) echo 'auth = "sso"' ;; esac
}
header_of() { # condition -> the load generator's --header-file
  case $1 in
    open-es | jwt-es) echo "authorization: $out/es256.tokens" ;;
    open-key | key) echo "x-api-key: $out/api-keys" ;;
    *) echo "authorization: $out/rs256.tokens" ;;
  esac
}
for c in "${conditions[@]}"; do
  [ "$c" = nginx-auth ] && continue
  cat > "$out/$c.toml" <<EOF
[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "origin"
endpoints = [{ address = "127.0.0.1:$up_port" }]

$(auth_of "$c")
[[routes]]
id = "all"
upstream = "origin"
path = { prefix = "/" }
$(route_auth "$c")
EOF
  "$b" check --config "$out/$c.toml" > /dev/null
done
mkdir -p "$out/nginx-auth-tmp"
sed -e "s|@DIR@|$out|g" -e "s|@UPSTREAM@|127.0.0.1:$up_port|g" -e "s|@AUTH@|127.0.0.1:$auth_port|g" \
  lab/nginx/auth-request.conf > "$out/nginx-auth.conf.in"

start_gateway() { # condition -> gw_pid (the process whose CPU counts), stop_pid, gw_port
  gw_port=$(free_port)
  if [ "$1" = nginx-auth ]; then
    sed -e "s|@LISTEN@|127.0.0.1:$gw_port|g" "$out/nginx-auth.conf.in" > "$out/nginx-auth.conf"
    "${prio[@]}" taskset -c 1 nginx -c "$out/nginx-auth.conf" -p "$out" >> "$out/nginx-auth.log" 2>&1 &
    stop_pid=$!
    pids+=("$stop_pid")
    wait_http "$gw_port"
    gw_pid=$(pgrep -P "$stop_pid" | head -1)
  else
    "${prio[@]}" taskset -c 1 "$b" run --config "$out/$1.toml" --threads 1 \
      --listen "127.0.0.1:$gw_port" --metrics-listen 127.0.0.1:0 >> "$out/gateway.log" 2>&1 &
    gw_pid=$!
    stop_pid=$gw_pid
    pids+=("$gw_pid")
    wait_http "$gw_port"
  fi
}
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(uname -r)"
  echo "tailguard: $b ($("$b" --version)); load: $load"
  nginx -v 2>&1
} > "$out/machine.txt"

ticks=$(getconf CLK_TCK)
cpu_of() { awk '{print $14, $15}' "/proc/$1/stat"; }
run_one() { # condition round -> "user_us system_us requests statuses"
  local c=$1 r=$2 h
  h=$(header_of "$c")
  start_gateway "$c"
  "${prio[@]}" "$load" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${warm}s" \
    --connections "$conns" --pin 0 --brief --header-file "$h" > /dev/null 2>&1
  local before after
  before=$(cpu_of "$gw_pid")
  "${prio[@]}" "$load" load "http://127.0.0.1:$gw_port/" --rate "$rate" --duration "${dur}s" \
    --connections "$conns" --pin 0 --brief --header-file "$h" \
    --json "$out/load-$c-$r.json" > "$out/load-$c-$r.txt" 2>&1
  after=$(cpu_of "$gw_pid")
  kill "$stop_pid"; wait "$stop_pid" 2>/dev/null || true
  python3 - "$before" "$after" "$ticks" "$out/load-$c-$r.json" <<'PY'
import json, sys
b = [int(x) for x in sys.argv[1].split()]
a = [int(x) for x in sys.argv[2].split()]
tck = int(sys.argv[3])
rep = json.load(open(sys.argv[4]))
done = rep["completed"]
st = ",".join(f"{k}x{v}" for k, v in sorted(rep["status"].items()))
err = sum(rep.get("errors", {}).values())
print(f"{(a[0]-b[0])*1e6/tck/done:.3f} {(a[1]-b[1])*1e6/tck/done:.3f} {done} {st}{',errors' + str(err) if err else ''}")
PY
}

: > "$out/rounds.txt"
k=${#conditions[@]}
for r in $(seq "$rounds"); do
  for i in $(seq 0 $((k - 1))); do
    c=${conditions[$(( (r - 1 + i) % k ))]}
    echo "== round $r: $c" >&2
    echo "$r $c $(run_one "$c" "$r")" >> "$out/rounds.txt"
  done
done

python3 - "$out" "$rate" "$dur" <<'PY' | tee "$out/summary.txt"
import statistics, sys
out, rate, dur = sys.argv[1], sys.argv[2], sys.argv[3]
rows, statuses = {}, {}
for line in open(f"{out}/rounds.txt"):
    r, c, user, system, done, st = line.split()
    rows.setdefault(int(r), {})[c] = (float(user), float(system), int(done))
    statuses.setdefault(c, set()).add(st.split("x")[0] if st.count("x") == 1 and "errors" not in st else st)
print(open(f"{out}/machine.txt").read().rstrip())
print(f"CPU per request (µs, user+system) of the serving process, {rate} req/s, {dur} s measured per run")
names = [c for c in ("open-rs", "jwt-rs", "open-es", "jwt-es", "open-key", "key", "fwd-cache", "fwd", "nginx-auth")
         if all(c in rows[r] for r in rows)]
print("round " + "".join(f"{n:>11}" for n in names))
for r in sorted(rows):
    print(f"{r:>5} " + "".join(f"{rows[r][n][0] + rows[r][n][1]:>11.2f}" for n in names))
print("median" + "".join(f"{statistics.median(rows[r][n][0] + rows[r][n][1] for r in rows):>11.2f}" for n in names))
print("user  " + "".join(f"{statistics.median(rows[r][n][0] for r in rows):>11.2f}" for n in names))
print("sys   " + "".join(f"{statistics.median(rows[r][n][1] for r in rows):>11.2f}" for n in names))
print("statuses: " + "; ".join(f"{n} {'/'.join(sorted(statuses[n]))}" for n in names))
goals = [("jwt-rs", "open-rs", 1.05, "JWT RS256 / no auth"), ("jwt-es", "open-es", 1.05, "JWT ES256 / no auth"),
         ("key", "open-key", 1.02, "API key / no auth"), ("fwd-cache", "open-rs", 1.05, "forward, cached / no auth"),
         ("fwd", "nginx-auth", 1.00, "forward, no cache / nginx auth_request"), ("fwd", "open-rs", None, "forward, no cache / no auth")]
print(f"{'ratio (per round)':<40} {'median':>7}  goal   met")
for a, b, goal, label in goals:
    if a not in names or b not in names:
        continue
    per = [(rows[r][a][0] + rows[r][a][1]) / (rows[r][b][0] + rows[r][b][1]) for r in sorted(rows)]
    med = statistics.median(per)
    g = f"<={goal:.2f}" if goal else "  -  "
    met = ("yes" if med <= goal else "NO") if goal else ""
    print(f"{label:<40} {med:>7.3f}  {g}  {met}   ({', '.join(f'{x:.3f}' for x in per)})")
PY
echo "raw: $out"
