#!/usr/bin/env bash
# Instructions and atomic read-modify-writes per proxied request, counted by callgrind:
# deterministic where CPU time on this shared host is not.
#   bash instructions.sh tailguard /path/to/tailguard   # build with RUSTFLAGS="--cfg rustix_use_libc"
#   bash instructions.sh nginx /path/to/tailguard       # (the tailguard binary serves as upstream)
# The proxy runs under callgrind on core 0, the upstream (`tailguard upstream`, native) and
# wrk (-t1 -c50, D seconds, default 6) on core 1. After a warm-up the counters are zeroed,
# wrk runs, and the counters are dumped: instructions / wrk's request count is the figure.
# rustix's raw Linux backend reads the vDSO's ELF header from the auxiliary vector, which
# valgrind does not map: the tailguard build must use rustix's libc backend (the cfg above).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proxy=$1; exe=$2; D=${D:-6}
out=$(mktemp -d /tmp/instructions.XXXXXX)
taskset -c 1 "$exe" upstream --listen 127.0.0.1:19201 --threads 1 --body-bytes 13 > "$out/upstream.log" 2>&1 &
up=$!
vg=(valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$out/cg.out")
if [ "$proxy" = nginx ]; then
  mkdir -p "$out/nginx"
  sed -e "s|@DIR@|$out/nginx|g" -e "s|@LISTEN@|127.0.0.1:19200|g" -e "s|@UPSTREAM@|127.0.0.1:19201|g" \
    "$here/../../../lab/nginx/proxy.conf" | sed 's/^worker_processes 1;/worker_processes 1;\nmaster_process off;/' > "$out/nginx/nginx.conf"
  taskset -c 0 "${vg[@]}" nginx -c "$out/nginx/nginx.conf" -p "$out/nginx" -e "$out/nginx/err.log" > "$out/proxy.log" 2>&1 &
  bin=$(command -v nginx)
else
  RUST_LOG=warn taskset -c 0 "${vg[@]}" "$exe" run --listen 127.0.0.1:19200 --threads 1 \
    --upstream demo=127.0.0.1:19201 > "$out/proxy.log" 2>&1 &
  bin=$exe
fi
pid=$!
trap 'kill $pid $up 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:19200/ && break; sleep 0.3; done
taskset -c 1 wrk -t1 -c50 -d2s http://127.0.0.1:19200/ > /dev/null
callgrind_control -z $pid > /dev/null
taskset -c 1 wrk -t1 -c50 -d${D}s http://127.0.0.1:19200/ > "$out/wrk.txt"
callgrind_control -d $pid > /dev/null
sleep 1
n=$(awk '/requests in/{print $1}' "$out/wrk.txt")
dump=$(ls "$out"/cg.out.* | sort -V | tail -1)
objdump -d --no-show-raw-insn "$bin" | awk '/^[0-9a-f]+ <.*>:$/{fn=$2} /\tlock |\txchg .*\(/{sub(":","",$1); print $1, fn}' > "$out/locks.txt"
python3 "$here/count.py" "$dump" "$n" "$out/locks.txt" "$(basename "$bin")" | c++filt
echo "raw: $out"
