#!/usr/bin/env bash
# Runs the given command with both ksoftirqd threads at SCHED_FIFO 1; restores SCHED_OTHER after.
set -u
pids=$(pgrep -x 'ksoftirqd/[01]' || pgrep ksoftirqd)
restore() { for p in $pids; do chrt -o -p 0 "$p"; done; ps -eo pid,cls,ni,rtprio,comm | grep ksoftirqd; }
trap restore EXIT
for p in $pids; do chrt -f -p 1 "$p"; done
ps -eo pid,cls,ni,rtprio,comm | grep ksoftirqd
"$@"
