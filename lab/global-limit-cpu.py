#!/usr/bin/env python3
"""What else ran during a measured round of lab/global-limit.sh (the machine is shared):

  global-limit-cpu.py snapshot > before.json          every process's CPU ticks now
  global-limit-cpu.py others before.json PID...       processes, other than PID... and
                                                      SCHED_IDLE ones (lab/keep-awake.sh's
                                                      spinners), that used > 20 ms of CPU since

Prints `comm:ms,comm:ms` (most first) or nothing. The load generator is not excluded: its
CPU is listed as `tailguard:...` with the gateway's own left out by PID.
"""
import json
import os
import sys

SCHED_IDLE = 5


def snapshot():
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        # comm may hold spaces and parentheses: the fields after it start past the last ')'.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2 :].split()
        # rest[0] is field 3 (state): utime is field 14, stime 15, policy 41.
        ticks = int(rest[11]) + int(rest[12])
        policy = int(rest[38]) if len(rest) > 38 else 0
        procs[pid] = [comm, ticks, policy]
    return procs


def main():
    if sys.argv[1] == "snapshot":
        json.dump(snapshot(), sys.stdout)
        return
    before = json.load(open(sys.argv[2]))
    skip = set(sys.argv[3:])
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    used = []
    for pid, (comm, ticks, policy) in snapshot().items():
        if pid in skip or policy == SCHED_IDLE:
            continue
        ms = (ticks - before.get(pid, [comm, 0, 0])[1]) * tick_ms
        if ms > 20:
            used.append((ms, comm))
    used.sort(reverse=True)
    print(",".join(f"{c.replace(' ', '_')}:{ms:.0f}" for ms, c in used))


if __name__ == "__main__":
    main()
