#!/bin/bash
# Every 0.5 s: per thread of each running gateway (tailguard run), minflt, majflt, utime,
# stime (ticks) and schedstat (run ns, wait ns, slices): to see faults and run-queue wait.
out=$1
while true; do
  now=$(date +%s.%N)
  for p in $(pgrep -f "tailguard[-a-z]* run --listen"); do
    for t in /proc/$p/task/*; do
      c=$(cat $t/comm 2>/dev/null) || continue
      st=$(cut -d' ' -f10,12,14,15 $t/stat 2>/dev/null)
      ss=$(cat $t/schedstat 2>/dev/null)
      echo "$now $p ${t##*/} $c $st $ss"
    done
  done >> $out
  sleep 0.5
done
