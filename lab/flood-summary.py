#!/usr/bin/env python3
"""A flood lab's summary (lab/basic-flood.sh, lab/jwt-flood.sh): per round, the /open/
route's P50/P99/P99.9/P100 without and with the flood on another route, the statuses, and
the median ratio of P99 flooded to quiet.
  lab/flood-summary.py OUT_DIR ROUNDS"""
import json, os, statistics, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hgrm import hgrm
out, rounds = sys.argv[1], int(sys.argv[2])
ratios = []
print(f"{'round':>5} {'condition':>9} {'P50 ms':>8} {'P99 ms':>8} {'P99.9 ms':>9} {'P100 ms':>8}  /open/ statuses; flood statuses")
for r in range(1, rounds + 1):
    p99 = {}
    for c in ("quiet", "flood"):
        p50, q99, q999, p100 = hgrm(f"{out}/{c}-{r}.hgrm")
        p99[c] = q99
        st = json.load(open(f"{out}/{c}-{r}.json"))["status"]
        extra = ""
        if c == "flood":
            f = json.load(open(f"{out}/{c}-{r}-flood.json"))
            extra = f"; {f['status']} errors {f['errors']} achieved {f['achieved_rate']:.0f}/s"
        print(f"{r:>5} {c:>9} {p50:>8.3f} {q99:>8.3f} {q999:>9.3f} {p100:>8.3f}  {st}{extra}")
    ratios.append(p99["flood"] / p99["quiet"])
print("P99 flood/quiet per round: " + ", ".join(f"{x:.3f}" for x in ratios))
print(f"median P99 ratio flood/quiet: {statistics.median(ratios):.3f}")
