#!/bin/bash
# Trace exporter at normal priority (before) vs SCHED_IDLE (after): P99-P100 at 2000 req/s.
cd /work/main
for r in 1 2; do
  for v in before after; do
    if [ $v = before ]; then tg=/work/bench/tailguard-trace-normal-prio; else tg=/work/bench/tailguard-trace-idle; fi
    OUT=/tmp/lat-ab/$v-$r TG=$tg LAT_ROUNDS=1 LAT_DURATION=20 timeout 600 lab/compare-trace.sh latency > /tmp/lat-ab/$v-$r.out 2>&1
    echo "$v-$r rc=$?"
  done
done
