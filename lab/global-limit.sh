#!/usr/bin/env bash
# Global rate limits shared through Redis (issue 49), measured with real gateways and a real
# redis-server (Debian's; scripts/install-tools installs it). Parts, run in this order unless
# PARTS names some:
#
#   accuracy  3 gateways, one key limited to 600 a minute (scope = "global", sync_ms 100),
#             offered 3x (30 req/s) split 70/20/10 by lab/global-limit.py; admitted per
#             full wall-clock minute (the limiter's windows) and over any sliding minute.
#   rotate    the same with the split rotating among the gateways every 30 s.
#   keys      $KEYS (10000) keys at once, each limited to $KEY_RATE (20) a minute and offered
#             3x (10,000 req/s in all), split 70/20/10 by three `tailguard load
#             --header-file ... --count-per-value 60s` processes: per full minute, how many
#             keys admitted how many (5 % of 20 is one request).
#   faults    the same traffic as accuracy; Redis SIGKILLed $FAULT_AT (20) s in, started again $FAULT_FOR
#             (20) s later, $FAULT_SECONDS (90) s in all: failed
#             requests, admitted per minute, and how long after Redis answered each gateway
#             counted globally again (its fallback gauge polled every 50 ms).
#   cost      one gateway (one serving thread, core 1) under `tailguard load` (core 0, with
#             Redis) at $RATE req/s, rounds interleaved over the conditions $CONDS (default
#             "none local global frozen slow"): a route with no limit, a local limit, a
#             global limit (one bucket, never reached), the global limit with Redis frozen
#             (SIGSTOP: every sync times out, the gateway falls back) and with Redis made
#             slow (`DEBUG SLEEP 0.25` every 0.3 s: syncs answered up to 0.25 s late), and
#             `gkeys`: a global limit per X-Api-Key with the load going round $COST_KEYS
#             (10000) keys (thousands of keys a sync: the sync thread's CPU counts). A
#             condition may end in `+idle` or `+normal`: the Redis sync thread set to
#             SCHED_IDLE or SCHED_OTHER at the gateway's nice (chrt, renice) after the start. Per round: gateway CPU
#             per request (/proc/PID/stat), the load's P50/P99, and every other process that
#             took more than 20 ms of CPU in the round (the machine is shared).
#   redis     what a Redis round trip per request (APISIX's default `limit-count` with
#             `policy = "redis"`) costs here: redis-benchmark running the limiter's own
#             script, one key, 32 clients: latency percentiles and Redis's CPU per call.
#
#   [NICE=-20] [ACC_SECONDS=185] [RATE=3000] [ROUNDS=4] [CONDS="global frozen"] [PARTS="accuracy cost"] lab/global-limit.sh
# Raw outputs go to $OUT (default a temp dir); summary.txt collects every part's lines.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${B:-target/release/tailguard}
acc_seconds=${ACC_SECONDS:-185}
rate=${RATE:-3000}
rounds=${ROUNDS:-4}
dur=${DURATION:-10}
parts=${PARTS:-accuracy rotate keys faults cost redis}
fault_at=${FAULT_AT:-20}
fault_for=${FAULT_FOR:-20}
fault_seconds=${FAULT_SECONDS:-90}
out=${OUT:-$(mktemp -d /tmp/global-limit.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in redis-server redis-cli redis-benchmark taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "global-limit: $tool is not installed (scripts/install-tools)" >&2; exit 1; }
done
[ -x "$b" ] || { echo "global-limit: $b is not built (cargo build --release -p tailguard)" >&2; exit 1; }
# NICE=-20: the gateways and `tailguard load` at that nice value (root), ahead of the kernel's
# own threads (writeback, kdamond, compaction) and other work on a shared machine.
prio=()
load_nice=()
if [ -n "${NICE:-}" ]; then prio=(nice -n "$NICE"); load_nice=(--nice "$NICE"); fi
# shellcheck source=lab/lib.sh
. lab/lib.sh
trap 'if [ -n "${redis_pid:-}" ]; then kill -CONT "$redis_pid" 2>/dev/null || true; fi; cleanup' EXIT
summary="$out/summary.txt"
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "tailguard: $b ($("$b" --version))"
  redis-server --version
} | tee "$summary"

redis_port=$(free_port)
redis_pid=
start_redis() {
  # Core 0, with the load generator: the gateways' core 1 stays theirs.
  taskset -c 0 redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --enable-debug-command local --dir "$out" --logfile "$out/redis.log" &
  redis_pid=$!
  pids+=("$redis_pid")
  for _ in $(seq 200); do
    [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] && return 0
    sleep 0.05
  done
  echo "global-limit: redis-server does not answer" >&2
  exit 1
}

# fleet_config RATE_LINE: a gateway's config, one route `/` with that rate_limit.
fleet_config() {
  cat <<EOF
[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "up"
builtin = { status = 200, body = "ok" }

[[routes]]
id = "api"
upstream = "up"
path = { prefix = "/" }
$1

[redis]
url = "redis://127.0.0.1:$redis_port"
sync_ms = 100
EOF
}

gw_ports=()
gw_metrics=()
gw_pids=()
# start_fleet N CONFIG: N gateways (one serving thread each, on core 1).
start_fleet() {
  gw_ports=(); gw_metrics=(); gw_pids=()
  for i in $(seq "$1"); do
    local port mport
    port=$(free_port); mport=$(free_port)
    ${prio[@]+"${prio[@]}"} taskset -c 1 "$b" run --config "$2" --threads 1 --listen "127.0.0.1:$port" \
      --metrics-listen "127.0.0.1:$mport" >> "$out/gateway-$i.log" 2>&1 &
    gw_pids+=($!); pids+=($!)
    gw_ports+=("$port"); gw_metrics+=("$mport")
    wait_port "$port"
  done
}
stop_fleet() { for p in "${gw_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
gateways_list() { local s=""; for p in "${gw_ports[@]}"; do s+="${s:+,}127.0.0.1:$p"; done; echo "$s"; }
gauge() { curl -fs "http://127.0.0.1:$1/metrics" | awk -v s="$2" '$1 == s { print $2 }'; }

limit_600='rate_limit = { rate = 600, per = "minute", key = "header:X-Api-Key", scope = "global" }'
fleet_config "$limit_600" > "$out/fleet.toml"

for part in $parts; do
  case $part in
    accuracy|rotate)
      start_redis
      start_fleet 3 "$out/fleet.toml"
      rotate=0; [ "$part" = rotate ] && rotate=30
      echo "== $part: 3 gateways, 600/min, 30 req/s split 70/20/10, rotate ${rotate}s, ${acc_seconds}s" >&2
      taskset -c 0 python3 lab/global-limit.py --gateways "$(gateways_list)" --split 70,20,10 \
        --total 30 --seconds "$acc_seconds" --key "$part-key" --window 60 --rotate "$rotate" \
        --records "$out/$part-records.txt" > "$out/$part.json"
      echo "$part: $(cat "$out/$part.json")" | tee -a "$summary"
      stop_fleet; kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
      ;;
    keys)
      # Many keys at once, driven by `tailguard load --header-file` (one process per gateway, each
      # going round the same $KEYS keys at its share of the rate, on core 0): each key is
      # limited to $KEY_RATE a minute and offered 3x that, split 70/20/10.
      start_redis
      nkeys=${KEYS:-10000}; krate=${KEY_RATE:-20}
      seq -f 'key-%.0f' 0 $(( nkeys - 1 )) > "$out/keys.txt"
      fleet_config "rate_limit = { rate = $krate, per = \"minute\", key = \"header:X-Api-Key\", scope = \"global\" }" > "$out/keys.toml"
      start_fleet 3 "$out/keys.toml"
      total=$(python3 -c "print($nkeys * $krate * 3 / 60)")
      echo "== keys: 3 gateways, $nkeys keys of $krate/min each offered 3x ($total req/s), split 70/20/10, ${acc_seconds}s" >&2
      loads=()
      for i in 0 1 2; do
        share=$(python3 -c "print($total * [0.7, 0.2, 0.1][$i])")
        "$b" load "http://127.0.0.1:${gw_ports[$i]}/" --rate "$share" --duration "${acc_seconds}s" \
          --connections 16 --pin 0 --header-file "X-Api-Key: $out/keys.txt" --count-per-value 60s --brief \
          --json "$out/keys-$i.json" > "$out/keys-$i.txt" 2>&1 &
        loads+=($!)
      done
      for p in "${loads[@]}"; do wait "$p"; done
      evicted=$(for m in "${gw_metrics[@]}"; do curl -fs "http://127.0.0.1:$m/metrics" | awk '$1 ~ /^tailguard_rate_limit_evictions_total/ { s += $2 } END { print s + 0 }'; done | xargs)
      syncs=$(for m in "${gw_metrics[@]}"; do gauge "$m" tailguard_rate_limit_sync_seconds_count; done | xargs)
      python3 - "$krate" "$out"/keys-[012].json <<'PY' | tee -a "$summary"
import json, sys
rate = int(sys.argv[1])
reports = [json.load(open(f)) for f in sys.argv[2:]]
start = max(r["keys"]["start_unix_ms"] for r in reports)
end = min(r["keys"]["end_unix_ms"] for r in reports)
wms = reports[0]["keys"]["window_ms"]
nkeys = reports[0]["keys"]["keys"]
sent = sum(r["sent"] for r in reports)
errors = sum(sum(r["errors"].values()) for r in reports)
statuses = {}
for r in reports:
    for s, n in r["status"].items():
        statuses[s] = statuses.get(s, 0) + n
print(f"keys: {nkeys} keys of {rate}/min offered 3x, split 70/20/10 over 3 processes of"
      f" `tailguard load --count-per-value`: sent {sent}, statuses {statuses}, failed {errors};"
      f" achieved req/s per gateway {[round(r['achieved_rate'], 1) for r in reports]}")
windows = sorted({int(w) for r in reports for w in r["keys"]["windows"]})
for w in windows:
    if not (w * wms >= start and (w + 1) * wms <= end):
        continue
    per_key = [0] * nkeys
    for r in reports:
        for k, c in enumerate(r["keys"]["windows"].get(str(w), [])):
            per_key[k] += c[0]
    hist = {}
    for a in per_key:
        hist[a] = hist.get(a, 0) + 1
    within = sum(1 for a in per_key if abs(a - rate) <= 0.05 * rate)
    print(f"keys: full minute {w} (unix {w * wms // 1000}): fleet admitted {sum(per_key)} of"
          f" {nkeys * rate}; keys by admitted {dict(sorted(hist.items()))}; within 5 % of {rate}:"
          f" {within} of {nkeys}; min {min(per_key)}, max {max(per_key)}")
PY
      echo "keys: evictions per gateway: $evicted; good syncs per gateway: $syncs" | tee -a "$summary"
      stop_fleet; kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
      ;;
    faults)
      start_redis
      start_fleet 3 "$out/fleet.toml"
      echo "== faults: Redis SIGKILLed at ${fault_at} s for ${fault_for} s, ${fault_seconds} s of traffic" >&2
      taskset -c 0 python3 lab/global-limit.py --gateways "$(gateways_list)" --split 70,20,10 \
        --total 30 --seconds "$fault_seconds" --key faults-key --window 60 --records "$out/faults-records.txt" \
        > "$out/faults.json" &
      load=$!
      sleep "$fault_at"
      kill -KILL "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
      killed_at=$(date +%s.%N)
      sleep "$fault_for"
      start_redis
      up_at=$(date +%s.%N)
      # How long after Redis answered each gateway counted globally again: the timestamp of
      # its "answers again" log line (written by the first sync that worked) against the
      # moment redis-cli first got PONG; and its fallback gauge read back at the end.
      wait "$load"
      back=$(for i in 1 2 3; do
        python3 - "$out/gateway-$i.log" "$up_at" <<'PY'
import datetime, sys
up = float(sys.argv[2])
for line in open(sys.argv[1]):
    if "answers again" in line:
        ts = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
        print(f"{ts - up:.3f}")
PY
      done | xargs)
      fallback=$(for m in "${gw_metrics[@]}"; do gauge "$m" tailguard_rate_limit_fallback; done | xargs)
      errors=$(for m in "${gw_metrics[@]}"; do gauge "$m" tailguard_rate_limit_sync_errors_total; done | xargs)
      logged=$(for i in 1 2 3; do grep -c "does not answer" "$out/gateway-$i.log" || true; done | xargs)
      echo "faults: killed at $killed_at, answering at $up_at; each gateway's first good sync after (s): $back; fallback gauges at the end: $fallback; sync errors: $errors; fallback log lines per gateway: $logged" | tee -a "$summary"
      echo "faults: $(cat "$out/faults.json")" | tee -a "$summary"
      python3 - "$out/faults-records.txt" "$killed_at" "$up_at" <<'PY' | tee -a "$summary"
import sys
recs = [l.split() for l in open(sys.argv[1])]
k, u = float(sys.argv[2]), float(sys.argv[3])
def admitted(a, b):
    return sum(1 for t, g, s, *_ in recs if a <= float(t) < b and s == "200")
d = u - k
print(f"faults: admitted while Redis was down ({d:.1f} s): {admitted(k, u)} (local_share: each gateway"
      f" at most 600 / 3 = 200 a minute of its own); in the {d:.0f} s before: {admitted(k - d, k)};"
      f" in the {d:.0f} s after: {admitted(u, u + d)}")
PY
      stop_fleet; kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
      ;;
    cost)
      start_redis
      base='[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "up"
builtin = { status = 200, body = "ok" }
'
      printf '%s\n[[routes]]\nid = "api"\nupstream = "up"\npath = { prefix = "/" }\n' "$base" > "$out/cost-none.toml"
      printf '%s\n[[routes]]\nid = "api"\nupstream = "up"\npath = { prefix = "/" }\nrate_limit = { rate = 1000000, burst = 1000000, key = "route" }\n' "$base" > "$out/cost-local.toml"
      printf '%s\n[[routes]]\nid = "api"\nupstream = "up"\npath = { prefix = "/" }\nrate_limit = { rate = 1000000000, per = "minute", key = "route", scope = "global" }\n\n[redis]\nurl = "redis://127.0.0.1:%s"\nsync_ms = 100\n' "$base" "$redis_port" > "$out/cost-global.toml"
      # gkeys: the global limit per API key, and the load going round $COST_KEYS keys, so
      # every sync has thousands of keys to send and read (milliseconds of the sync
      # thread's CPU on the gateway's core).
      printf '%s\n[[routes]]\nid = "api"\nupstream = "up"\npath = { prefix = "/" }\nrate_limit = { rate = 1000000000, per = "minute", key = "header:X-Api-Key", scope = "global" }\n\n[redis]\nurl = "redis://127.0.0.1:%s"\nsync_ms = 100\n' "$base" "$redis_port" > "$out/cost-gkeys.toml"
      seq -f 'key-%.0f' 0 $(( ${COST_KEYS:-10000} - 1 )) > "$out/cost-keys.txt"
      ticks=$(getconf CLK_TCK)
      : > "$out/cost-rounds.txt"
      read -r -a conds <<< "${CONDS:-none local global frozen slow}"
      n=${#conds[@]}
      for r in $(seq "$rounds"); do
        for i in $(seq 0 $(( n - 1 ))); do
          c=${conds[$(( (r - 1 + i) % n ))]}
          base=${c%+*}
          echo "== cost round $r: $c" >&2
          case $base in frozen|slow) cfg=global ;; *) cfg=$base ;; esac
          keys=()
          if [ "$base" = gkeys ]; then keys=(--header-file "X-Api-Key: $out/cost-keys.txt"); fi
          start_fleet 1 "$out/cost-$cfg.toml"
          sync_tid=$(grep -l '^tailguard-redis' /proc/"${gw_pids[0]}"/task/*/comm 2>/dev/null | head -1 | cut -d/ -f5 || true)
          case $c in
            *+idle) chrt -i -p 0 "$sync_tid" ;;
            *+normal) chrt -o -p 0 "$sync_tid"; renice -n "${NICE:-0}" -p "$sync_tid" > /dev/null ;;
          esac
          # frozen: the global limit with Redis stopped (SIGSTOP): every sync times out
          # (timeout_ms, 1 s) and the gateway falls back; its requests must not notice.
          # slow: Redis busy in DEBUG SLEEP 0.25 s of every 0.3 s (one redis-cli on core 0):
          # every sync waits for it, none times out.
          slow_pid=
          if [ "$base" = frozen ]; then kill -STOP "$redis_pid"; fi
          if [ "$base" = slow ]; then
            taskset -c 0 redis-cli -p "$redis_port" -r -1 -i 0.05 DEBUG SLEEP 0.25 > /dev/null 2>&1 &
            slow_pid=$!
          fi
          "$b" load "http://127.0.0.1:${gw_ports[0]}/" --rate "$rate" --duration 3s --connections 16 --pin 0 ${load_nice[@]+"${load_nice[@]}"} ${keys[@]+"${keys[@]}"} --brief > /dev/null 2>&1
          python3 lab/global-limit-cpu.py snapshot > "$out/cpu-before.json"
          before=$(awk '{print $14 + $15}' "/proc/${gw_pids[0]}/stat")
          "$b" load "http://127.0.0.1:${gw_ports[0]}/" --rate "$rate" --duration "${dur}s" --connections 16 --pin 0 \
            ${load_nice[@]+"${load_nice[@]}"} ${keys[@]+"${keys[@]}"} --brief --json "$out/cost-$c-$r.json" --hgrm "$out/cost-$c-$r.hgrm" > "$out/cost-$c-$r.txt" 2>&1
          after=$(awk '{print $14 + $15}' "/proc/${gw_pids[0]}/stat")
          others=$(python3 lab/global-limit-cpu.py others "$out/cpu-before.json" "${gw_pids[0]}")
          syncs=$(gauge "${gw_metrics[0]}" tailguard_rate_limit_sync_seconds_count)
          if [ -n "$slow_pid" ]; then kill "$slow_pid"; wait "$slow_pid" 2>/dev/null || true; fi
          if [ "$base" = frozen ]; then kill -CONT "$redis_pid"; fi
          python3 - "$before" "$after" "$ticks" "$out/cost-$c-$r.json" "$r" "$c" "$out/cost-$c-$r.hgrm" "${syncs:--}" "$others" <<'PY' >> "$out/cost-rounds.txt"
import json, sys
sys.path.insert(0, "lab")  # lab/hgrm.py (run from the repository's root)
from hgrm import hgrm
b, a, tck = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rep = json.load(open(sys.argv[4]))
done = rep["completed"]
p50, p99, p999, p100 = hgrm(sys.argv[7])
bad = sum(rep["errors"].values()) + sum(n for s, n in rep["status"].items() if s != "200")
print(sys.argv[5], sys.argv[6], f"{(a - b) * 1e6 / tck / done:.2f}", f"{p50:.3f}", f"{p99:.3f}",
      f"{p999:.3f}", f"{p100:.3f}", done, bad, sys.argv[8], sys.argv[9] or "-")
PY
          stop_fleet
        done
      done
      python3 - "$out/cost-rounds.txt" "$rate" "$dur" "${conds[@]}" <<'PY' | tee -a "$summary"
import statistics, sys
rows = [l.split(maxsplit=10) for l in open(sys.argv[1])]
print(f"cost: {sys.argv[2]} req/s for {sys.argv[3]} s a round; per round: round cond cpu_us/req"
      " p50_ms p99_ms p99.9_ms p100_ms completed errors good_syncs others(>20ms CPU in the round)")
for r in rows:
    print("cost:  ", " ".join(x.strip() for x in r))
med = {}
for c in sys.argv[4:]:
    cpu = [float(r[2]) for r in rows if r[1] == c]
    p99 = [float(r[4]) for r in rows if r[1] == c]
    med[c] = (statistics.median(cpu), statistics.median(p99))
    print(f"cost: median {c}: {med[c][0]:.2f} us CPU/request, P99 {med[c][1]:.3f} ms"
          f" (P99 of the rounds {min(p99):.3f}-{max(p99):.3f})")
if "global" in med and "local" in med:
    print(f"cost: global / local: CPU {med['global'][0] / med['local'][0]:.3f}x,"
          f" P99 {med['global'][1] / med['local'][1]:.3f}x")
for c in med:
    if c != "global" and c.split("+")[0] in ("global", "frozen", "slow", "gkeys") and "global" in med:
        print(f"cost: {c} / global: P99 {med[c][1] / med['global'][1]:.3f}x")
PY
      kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
      ;;
    redis)
      start_redis
      sha=$(redis-cli -p "$redis_port" SCRIPT LOAD "$(python3 - <<'PY'
import re
src = open("crates/policy/src/rate_limit/sync.rs").read()
print(re.search(r'COUNT_SCRIPT: &str = r"(.*?)";', src, re.S).group(1))
PY
)")
      cpu0=$(awk '{print $14 + $15}' "/proc/$redis_pid/stat")
      taskset -c 0 redis-benchmark -p "$redis_port" -n 200000 -c 32 --csv \
        EVALSHA "$sha" 2 "tailguard:rl:route:api:1:k" "tailguard:rl:route:api:0:k" 120000 1 0 > "$out/redis-benchmark.csv"
      cpu1=$(awk '{print $14 + $15}' "/proc/$redis_pid/stat")
      echo "redis: one EVALSHA of the limiter's script per request (what asking Redis on every request costs), 32 clients, 200000 calls:" | tee -a "$summary"
      sed 's/^/redis:   /' "$out/redis-benchmark.csv" | tee -a "$summary"
      python3 -c "print(f'redis: Redis CPU per call: {($cpu1 - $cpu0) * 1e6 / $(getconf CLK_TCK) / 200000:.2f} us')" | tee -a "$summary"
      kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
      ;;
    *) echo "global-limit: unknown part $part" >&2; exit 2 ;;
  esac
done
echo "outputs in $out" >&2
