#!/usr/bin/env python3
"""Sorts one core's cpu-clock samples with their call chains (`perf script -F comm,ip,sym` of a
`perf record -g`) into what the serving core's busy time goes to: user space, system-call
entry and exit, epoll_wait, wake-ups, the scheduler, the TCP/IP stack, the rest of the
kernel; and, for a traced gateway, the tracer: every sample of its exporter thread
(`trace-exporter`, user and kernel) and the serving thread's samples whose leaf is the
tracer's own code (a lower bound: what is inlined into the proxy's functions is not told
apart). Used by lab/syscalls.sh's PROFILE=1 mode (issue 25: what io_uring could save at
most; issue 24: the tracer's share of a traced gateway's CPU).

A kernel sample is sorted by its whole chain, not its leaf: on a VM the sampling interrupt
waits while the kernel runs with interrupts off, so a quarter to a third of all samples land
on `_raw_spin_unlock_irqrestore`, whoever called it. The first rule that matches any frame
wins. Shares are of the samples; perf took none in the idle task on the lab VM, so they are
shares of the core's busy time: multiply by the CPU time per request that
lab/compare-cpu.sh measures to get microseconds.

usage: kernel-split.py NAME STACKS_TXT"""
import re
import sys

RULES = [
    # epoll_wait itself: collecting ready events, re-polling the sockets (tcp_poll), sleeping.
    ("epoll_wait", r"^(do_epoll_wait|ep_poll|ep_send_events|__x64_sys_epoll_wait)$"),
    # Waking a waiter: epoll's callback on a socket's wait queue and the task wake-up it makes.
    ("wake-ups", r"^(ep_poll_callback|__wake_up_common|__wake_up_sync_key|try_to_wake_up"
     r"|sock_def_readable|sk_stream_write_space|tcp_data_ready)$"),
    ("scheduler", r"^(__schedule|schedule|schedule_hrtimeout_range|finish_task_switch"
     r"|schedule_hrtimeout_range_clock)"),
    ("timers and ticks", r"^(hrtimer_interrupt|__sysvec_apic_timer_interrupt"
     r"|sysvec_apic_timer_interrupt|tick_sched_timer|update_process_times)$"),
    # The stack's work on both sockets, with the loopback softirq that delivers each packet.
    ("TCP/IP stack", r"^(tcp_|__tcp_|ip_|__ip_|sock_sendmsg|sock_recvmsg|__sys_sendto"
     r"|__sys_recvfrom|inet_|net_rx_action|__netif|netif_|process_backlog|__napi"
     r"|do_softirq|__do_softirq|handle_softirqs|sock_write_iter|sock_read_iter|do_writev"
     r"|vfs_writev|__x64_sys_writev|__x64_sys_sendto|__x64_sys_recvfrom|skb_)"),
    ("futex", r"^(futex_|__x64_sys_futex|do_futex)"),
    ("entry/exit", r"^(entry_SYSCALL_64|do_syscall_64|syscall_exit_to_user_mode"
     r"|exit_to_user_mode|syscall_return_via_sysret|entry_SYSCALL_64_after_hwframe)"),
]
USER = "user space"
EXPORTER = "tracing: exporter thread"
TRACER_LEAF = "tracing: serving thread"
TRACER_CODE = r"tailguard_trace::|tailguard_proxy::trace::"


def classify(comm, frames):
    """frames: (symbol, is_kernel) from the leaf up. User-space chains are not followed:
    the release build keeps no frame pointers, so only the leaf is sure."""
    if comm.startswith("trace-exporter"):
        return EXPORTER
    if frames and not frames[0][1]:
        return TRACER_LEAF if re.search(TRACER_CODE, frames[0][0]) else USER
    symbols = [s for s, _ in frames]
    for group, pattern in RULES:
        if any(re.search(pattern, s) for s in symbols):
            return group
    return "other kernel"


def samples(path):
    """Yields (command, frames) per sample."""
    frames = []
    comm = ""
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if not line.strip():
            if frames:
                yield comm, frames
            frames = []
            continue
        if not line.startswith(("\t", " " * 8)) and not re.match(r"\s+[0-9a-f]{6,}\s", line):
            # A sample's header (the command); its frames follow.
            if frames:
                yield comm, frames
            frames = []
            comm = line.strip()
            continue
        match = re.match(r"\s*([0-9a-f]+)\s+(\S+)", line)
        if match:
            symbol = match[2].split("+0x")[0]
            frames.append((symbol, int(match[1], 16) >= 0xFFFF800000000000))
    if frames:
        yield comm, frames


def main():
    name, path = sys.argv[1], sys.argv[2]
    counts = {}
    total = 0
    leaf_other = {}
    for comm, frames in samples(path):
        group = classify(comm, frames)
        counts[group] = counts.get(group, 0) + 1
        total += 1
        if group == "other kernel":
            leaf_other[frames[0][0]] = leaf_other.get(frames[0][0], 0) + 1
    print(f"== {name}: {total} samples of the busy core 1; share of its busy time:")
    order = [USER] + [g for g, _ in RULES] + ["other kernel", EXPORTER, TRACER_LEAF]
    for group in order:
        if group in counts:
            print(f"  {group:<17} {counts[group] / total * 100:5.1f} %")
    top = sorted(leaf_other.items(), key=lambda kv: -kv[1])[:6]
    if top:
        print("  other kernel's leaves: " + ", ".join(f"{s} {n / total * 100:.1f}%" for s, n in top))


if __name__ == "__main__":
    main()
