#!/usr/bin/env python3
"""The tracer's samples in `perf script -F comm,ip,sym` stacks (lab/syscalls.sh PROFILE=1
with a [tracing] table), pooled over the files given, by what they were: the exporter
thread's (`trace-exporter`) by the kind of kernel work in their call chain (page faults,
TCP sends and receives, the scheduler, epoll) or else their leaf function, and the
serving thread's whose leaf is the tracer's code, by that function. Shares are of all
samples of the serving core. A lower bound on the serving side, as kernel-split.py says:
code inlined into the proxy's functions counts as theirs.

    python3 lab/tracer-split.py OUT1/stacks-tailguard.txt [OUT2/stacks-tailguard.txt ...]
"""
import collections
import re
import sys

KERNEL_WORK = [
    ("page faults", r"exc_page_fault"),
    ("TCP send", r"tcp_sendmsg|__sys_sendto|sock_write_iter|do_writev"),
    ("TCP receive", r"tcp_recvmsg|sock_read_iter|recvfrom"),
    ("scheduler", r"schedule|finish_task_switch"),
    ("epoll_wait", r"epoll_wait"),
    ("futex", r"futex"),
]
TRACER = re.compile(r"tailguard_trace::|tailguard_proxy::trace::")


def samples(path):
    """Each sample: its lines (the comm line first, then its frames, leaf first)."""
    cur = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                if cur:
                    yield cur
                cur = []
                continue
            cur.append(line.rstrip())
    if cur:
        yield cur


def main():
    counts = collections.Counter()
    total = 0
    for path in sys.argv[1:]:
        for s in samples(path):
            total += 1
            comm = s[0].split()[0]
            leaf = s[1].split(None, 1)[1] if len(s) > 1 else "?"
            if comm == "trace-exporter":
                chain = "\n".join(s[1:])
                kind = next((name for name, pat in KERNEL_WORK if re.search(pat, chain)), leaf)
                counts[("exporter", kind[:70])] += 1
            elif TRACER.search(leaf):
                counts[("serving", leaf[:70])] += 1
    if not total:
        sys.exit("tracer-split: no samples")
    for (side, what), n in counts.most_common(16):
        print(f"{100 * n / total:6.3f} %  {side:<8} {what}")
    for side in ("exporter", "serving"):
        share = sum(n for (s, _), n in counts.items() if s == side)
        print(f"{side} thread in all: {100 * share / total:.2f} %")


if __name__ == "__main__":
    main()
