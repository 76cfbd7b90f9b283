#!/usr/bin/env bash
# Runs a command with every CPU kept awake, so that a latency measured on this VM is the
# gateway's and not the hypervisor's: an idle vCPU here halts and takes milliseconds to wake,
# and on a quiet machine every build fell seconds behind at 5,000 req/s (P50 0.08-0.46 s)
# where with the vCPUs kept awake P50 was 0.28 ms and P99 3.8-4.0 ms (the 2026-12-02 note).
#
# One spinner per CPU, pinned, at SCHED_IDLE: it runs only when nothing else wants that CPU,
# so it takes no time from the gateway, the load generator or the origin, and a process's
# own CPU time (what the lab's CPU-per-request figures read) is unchanged. It does count as
# busy time in /proc/stat: do not use it for the shedding scenarios, whose shedder reads
# the CPUs' busy time (crates/overload/src/cpu.rs). The spinners stop when the command ends,
# however it ends.
#   lab/keep-awake.sh lab/compare-cpu.sh
#   lab/keep-awake.sh target/release/tailguard lab --quick
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: lab/keep-awake.sh COMMAND [ARGS...]" >&2; exit 2; }
spinners=()
stop_spinners() { for p in "${spinners[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_spinners EXIT
for cpu in $(seq 0 $(( $(nproc --all) - 1 ))); do
  taskset -c "$cpu" chrt -i 0 sh -c 'while :; do :; done' &
  spinners+=($!)
done
status=0
"$@" || status=$?
exit "$status"
