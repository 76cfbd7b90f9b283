#!/usr/bin/env bash
# usage: perfgw.sh LABEL [gateway flags]; wrk 8 s at max, perf 5 s; prints req/s and % of gateway CPU samples in access-log code
exe=/work/wt/accesslog/target/release/tailguard
label=$1; shift
taskset -c 1 $exe upstream --listen 127.0.0.1:0 --body-bytes 111 --threads 1 > /tmp/pf-up.out 2>&1 & up=$!
for i in $(seq 50); do grep -q '^listening on ' /tmp/pf-up.out && break; sleep 0.1; done
uaddr=$(sed -n 's/^listening on //p' /tmp/pf-up.out)
taskset -c 0 $exe run --listen 127.0.0.1:18081 --threads 1 --upstream demo=$uaddr "$@" 2>/tmp/pf-gw.err & gw=$!
for i in $(seq 50); do grep -q 'listening on' /tmp/pf-gw.err && break; sleep 0.1; done
(sleep 1; perf record -e cpu-clock -p $gw -o /tmp/pf-$label.data -- sleep 5 >/dev/null 2>&1) &
rps=$(taskset -c 1 wrk -t1 -c32 -d8s http://127.0.0.1:18081/ | sed -n 's/Requests\/sec: *//p')
sleep 1; kill -TERM $gw; wait $gw; kill $up; wait $up 2>/dev/null
total=$(perf report -i /tmp/pf-$label.data --stdio --sort comm 2>/dev/null | grep -E "^ +[0-9]" | awk '{s+=$1} END {print s}')
logpct=$(perf report -i /tmp/pf-$label.data --no-children --stdio --sort comm,sym 2>/dev/null | grep -E "tailguard_access_log|tailguard-log-w|access_log::" | awk '{s+=$1} END {printf "%.2f", s}')
echo "$label rps=$rps access_log_share_of_gateway_cpu=${logpct}%"
