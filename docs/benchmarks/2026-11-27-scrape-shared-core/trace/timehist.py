#!/usr/bin/env python3
"""Reads `perf sched timehist` (one line per context switch: the task that just ran, its wait
time, scheduling delay and run time) and prints, for each serving thread (one per gateway,
i.e. per condition run), its scheduling delays (wake-up to running) split by the task that
ran just before it on its cpu: what it waited behind."""
import re, sys, collections
line_re = re.compile(r'^\s*([\d.]+)\s+\[(\d+)\]\s+(.+?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$')
last_on_cpu = {}
d = collections.defaultdict(list)
first = {}
for line in sys.stdin:
    m = line_re.match(line)
    if not m:
        continue
    t, cpu, task, wait, sch, run = m.groups()
    cpu = int(cpu)
    prev = last_on_cpu.get(cpu, '?')
    last_on_cpu[cpu] = task
    if task.startswith('tailguard-serve'):
        prev_name = re.sub(r'\[.*', '', prev)
        d[(task, prev_name)].append(float(sch) * 1000)  # ms -> us
        first.setdefault(task, float(t))
def q(v, p):
    v = sorted(v); return v[min(len(v) - 1, int(p / 100 * len(v)))]
print(f"{'serving thread':30} {'ran before it':20} {'n':>7} {'p50us':>8} {'p99us':>8} {'p99.9us':>8} {'maxus':>8}")
for task in sorted(first, key=first.get):
    for (tk, prev), v in sorted(d.items(), key=lambda kv: -len(kv[1])):
        if tk != task or len(v) < 3:
            continue
        print(f"{task:30} {prev:20} {len(v):>7} {q(v,50):8.1f} {q(v,99):8.1f} {q(v,99.9):8.1f} {max(v):8.1f}")
