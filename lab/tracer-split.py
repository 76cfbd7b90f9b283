#!/usr/bin/env python3
"""The tracer's samples in `perf script -F comm,ip,sym` stacks (lab/syscalls.sh PROFILE=1
with a [tracing] table), pooled over the files given, by what they were: the exporter
thread's (`trace-exporter`) by the kind of kernel work in their call chain (page faults,
TCP sends and receives, the scheduler, epoll) or else their leaf function, and the
serving thread's whose leaf is the tracer's code, by that function. Shares are of all
samples of the serving core. By symbol this is a lower bound on the serving side, as
kernel-split.py says: code inlined into the proxy's functions counts as theirs. With
--binary (the gateway that was sampled, built with line tables, as release and PGO builds
are), each serving-thread sample's address is also looked up with `addr2line -i`, and one
counts as the tracer's when any function inlined at that address is from the tracer's
source (crates/trace/src, crates/proxy/src/trace.rs): the last line printed.

    python3 lab/tracer-split.py [--binary BIN] OUT1/stacks-tailguard.txt [OUT2/...]
"""
import collections
import re
import subprocess
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
TRACER_SOURCE = re.compile(r"crates/trace/src/|crates/proxy/src/trace\.rs")


def text_shift(binary):
    """What to add to a sampled address (perf prints the executable mapping's file offset)
    for the address in `binary`'s symbols: its executable segment's address less its offset."""
    out = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        f = line.split()
        if f[:1] == ["LOAD"] and "E" in f[6:-1]:
            return int(f[2], 16) - int(f[1], 16)
    sys.exit(f"tracer-split: no executable segment in {binary}")


def tracer_addresses(binary, addresses):
    """The sampled addresses (hex strings) at which `binary` runs the tracer's code, inlined
    or not."""
    shift = text_shift(binary)
    looked_up = [hex(int(a, 16) + shift) for a in addresses]
    out = subprocess.run(
        ["addr2line", "-i", "-a", "-e", binary, *looked_up],
        capture_output=True, text=True, check=True,
    ).stdout
    found, current = set(), None
    for line in out.splitlines():
        if line.startswith("0x"):
            current = int(line, 16) - shift
        elif current is not None and TRACER_SOURCE.search(line):
            found.add(current)
    return found


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
    args = sys.argv[1:]
    binary = None
    if args[:1] == ["--binary"]:
        binary, args = args[1], args[2:]
    counts = collections.Counter()
    serving_at = collections.Counter()
    total = 0
    for path in args:
        for s in samples(path):
            total += 1
            comm = s[0].split()[0]
            leaf = s[1].split(None, 1)[1] if len(s) > 1 else "?"
            if comm.startswith("tailguard-serv") and len(s) > 1:
                serving_at[s[1].split(None, 1)[0]] += 1
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
    if binary:
        user = [a for a in serving_at if not a.startswith("ffff")]
        tracer = tracer_addresses(binary, user)
        n = sum(serving_at[a] for a in user if int(a, 16) in tracer)
        print(f"serving thread, inlined code included: {100 * n / total:.2f} %")


if __name__ == "__main__":
    main()
