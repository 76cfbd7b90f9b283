#!/usr/bin/env python3
"""The traffic of lab/global-limit.sh: requests for one key sent to several gateways at fixed
rates (a split such as 70/20/10 of the total), paced on a schedule (open loop: a late request
is sent at once, never skipped), one keep-alive connection per gateway and thread; every
answer recorded as (unix seconds, gateway, status). Optionally the split rotates among the
gateways every --rotate seconds. Prints a JSON summary: admitted per aligned wall-clock
window of --window seconds (the limiter's own windows), the largest count over any sliding
window, and the failures (anything but 200 and 429, or no answer).

  global-limit.py --gateways 127.0.0.1:8001,127.0.0.1:8002,127.0.0.1:8003 \
      --split 70,20,10 --total 30 --seconds 185 --key k --window 60 [--rotate 30]
"""
import argparse
import http.client
import json
import threading
import time


def sender(addr, path, keys, rate_of, stop_at, records, lock, index):
    host, port = addr.rsplit(":", 1)
    conn = None
    next_t = time.time()
    n = 0
    while True:
        now = time.time()
        if now >= stop_at:
            break
        rate = rate_of(now)
        if rate <= 0:
            time.sleep(0.01)
            next_t = time.time()
            continue
        if next_t > now:
            time.sleep(next_t - now)
        next_t += 1.0 / rate
        t = time.time()
        try:
            if conn is None:
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.request("GET", path, headers={"X-Api-Key": keys[n % len(keys)]})
            n += 1
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except Exception as e:  # noqa: BLE001 - every failure is recorded, never raised
            status = f"error: {e}"
            conn = None
            n += 1
        with lock:
            records.append((t, index, status, keys[(n - 1) % len(keys)]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gateways", required=True)
    p.add_argument("--split", default="70,20,10")
    p.add_argument("--total", type=float, required=True, help="requests per second, all gateways")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--key", default="lab-key")
    p.add_argument("--keys", type=int, default=1, help="distinct keys, round robin")
    p.add_argument("--path", default="/")
    p.add_argument("--window", type=float, default=60)
    p.add_argument("--rotate", type=float, default=0)
    p.add_argument("--records")
    a = p.parse_args()
    gws = a.gateways.split(",")
    split = [float(x) / 100 for x in a.split.split(",")]
    assert len(split) == len(gws)
    start = time.time()
    stop_at = start + a.seconds
    records, lock = [], threading.Lock()

    def rate_for(i):
        def rate_of(now):
            shift = int((now - start) // a.rotate) if a.rotate > 0 else 0
            return a.total * split[(i + shift) % len(gws)]
        return rate_of

    keys = [a.key] if a.keys == 1 else [f"{a.key}-{k}" for k in range(a.keys)]
    threads = []
    for i, g in enumerate(gws):
        # One thread per gateway; several keys are taken in turn (each its share of the rate).
        th = threading.Thread(
            target=sender,
            args=(g, a.path, keys, rate_for(i), stop_at, records, lock, i),
            daemon=True,
        )
        th.start()
        threads.append(th)
    for th in threads:
        th.join()

    ok = sorted(t for t, _, s, _ in records if s == 200)
    failures = [(t, i, s) for t, i, s, _ in records if s not in (200, 429)]
    by_window = {}
    for t in ok:
        w = int(t // a.window)
        by_window[w] = by_window.get(w, 0) + 1
    first_full = int(start // a.window) + 1
    last_full = int(stop_at // a.window) - 1
    full = {w: by_window.get(w, 0) for w in range(first_full, last_full + 1)}
    # The largest count over any sliding window of the same length (two pointers).
    best, j = 0, 0
    for i, t in enumerate(ok):
        while ok[j] <= t - a.window:
            j += 1
        if t - a.window >= start:
            best = max(best, i - j + 1)
    per_gw = [sum(1 for _, g, s, _ in records if g == i and s == 200) for i in range(len(gws))]
    summary = {
        "sent": len(records),
        "admitted": len(ok),
        "admitted_per_gateway": per_gw,
        "failures": len(failures),
        "first_failures": [str(f) for f in failures[:5]],
        "full_windows": [{"window_start_unix": int(w * a.window), "admitted": n} for w, n in full.items()],
        "max_sliding_window": best,
    }
    if len(keys) > 1:
        # Per key and full window: how many keys admitted how many.
        counts = {}
        for t, _, s, k in records:
            w = int(t // a.window)
            if s == 200 and first_full <= w <= last_full:
                counts[(k, w)] = counts.get((k, w), 0) + 1
        for w in full:
            per_key = [counts.get((k, w), 0) for k in keys]
            hist = {}
            for c in per_key:
                hist[c] = hist.get(c, 0) + 1
            summary.setdefault("per_key_full_windows", []).append(
                {"window_start_unix": int(w * a.window), "keys": len(keys),
                 "min": min(per_key), "max": max(per_key), "admitted_histogram": hist})
    if a.records:
        with open(a.records, "w") as f:
            for t, i, s, k in records:
                f.write(f"{t:.3f} {i} {s} {k}\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
