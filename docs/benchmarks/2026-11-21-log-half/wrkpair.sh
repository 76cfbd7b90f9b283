#!/usr/bin/env bash
# usage: wrkpair.sh LABEL [gateway flags...]; prints wrk req/s through the gateway (1 thread, core 0), wrk on core 1
set -u
exe=/work/wt/accesslog/target/release/tailguard
label=$1; shift
taskset -c 1 $exe upstream --listen 127.0.0.1:0 --body-bytes 111 --threads 1 > /tmp/wp-up.out 2>&1 &
up=$!
for i in $(seq 50); do grep -q '^listening on ' /tmp/wp-up.out && break; sleep 0.1; done
uaddr=$(sed -n 's/^listening on //p' /tmp/wp-up.out)
taskset -c 0 $exe run --listen 127.0.0.1:18080 --threads 1 --upstream demo=$uaddr "$@" 2>/tmp/wp-gw.err &
gw=$!
for i in $(seq 50); do grep -q 'listening on' /tmp/wp-gw.err && break; sleep 0.1; done
r=$(taskset -c 1 wrk -t1 -c32 -d8s http://127.0.0.1:18080/ | sed -n 's/Requests\/sec: *//p')
kill -TERM $gw; wait $gw
kill $up; wait $up 2>/dev/null
echo "$label $r $(grep -o 'lines=[0-9]* dropped=[0-9]*' /tmp/wp-gw.err)"
