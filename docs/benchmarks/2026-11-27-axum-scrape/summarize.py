#!/usr/bin/env python3
"""Summarizes a `tailguard lab axum-scrape` output directory: every round's P99/P99.9/P100
per condition, each round's scraped/unscraped ratio per middleware and their medians, and
each middleware's CPU per request against the bare app's of the same round (cpu.tsv).

    python3 summarize.py OUT_DIR [SERIES_LABEL]      # SERIES_LABEL default "100k"
"""
import csv
import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1]
series = sys.argv[2] if len(sys.argv) > 2 else "100k"
PCTS = ["99", "99.9", "100"]


def slug(name):
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", name.lower())).strip("-")


def percentiles(path):
    d = json.load(open(path))
    p = dict(d["latency"]["summary"]["percentiles_us"])
    scrapes = [s["duration_ms"] for s in d.get("scrapes", []) if s.get("status") == 200]
    during = d.get("latency_during_scrape", {}).get("summary", {})
    overlap = dict(during.get("percentiles_us", [])).get("100")
    return {k: p[k] / 1000 for k in PCTS}, d["achieved_rate"], (scrapes, overlap)


def seeds_of(cond):
    runs = {}
    for f in glob.glob(os.path.join(out, f"{slug(cond)}-seed*.json")):
        m = re.search(r"-seed(\d+)\.json$", f)
        if m and not re.search(r"-seed\d+-", os.path.basename(f)):
            runs[int(m.group(1))] = percentiles(f)
    return runs


def med(xs):
    return statistics.median(xs) if xs else float("nan")


print(f"## Latency (ms, from the intended send time), {series} series\n")
for mw in ["axum-prometheus", "tailguard"]:
    un, sc = seeds_of(f"{mw} {series}, no scrape"), seeds_of(f"{mw} {series}, scrape 5s")
    print(f"### {mw}\n")
    print("| round | unscraped P99 / P99.9 / P100 | scraped P99 / P99.9 / P100 | ratio P99 / P99.9 / P100 | longest scrape | P100 of requests overlapping a scrape |")
    print("|---|---|---|---|---|---|")
    ratios = {k: [] for k in PCTS}
    for seed in sorted(set(un) & set(sc)):
        (u, _, _), (s, _, (scr, overlap)) = un[seed], sc[seed]
        r = {k: s[k] / u[k] for k in PCTS}
        for k in PCTS:
            ratios[k].append(r[k])
        fmt = lambda v: " / ".join(f"{v[k]:.2f}" for k in PCTS)
        print(f"| {seed} | {fmt(u)} | {fmt(s)} | {' / '.join(f'{r[k]:.3f}' for k in PCTS)} | {max(scr, default=0):.1f} ms | {(overlap or 0) / 1000:.2f} ms |")
    mu = {k: med([v[0][k] for v in un.values()]) for k in PCTS}
    ms = {k: med([v[0][k] for v in sc.values()]) for k in PCTS}
    print(f"| median | {' / '.join(f'{mu[k]:.2f}' for k in PCTS)} | {' / '.join(f'{ms[k]:.2f}' for k in PCTS)} | {' / '.join(f'{med(ratios[k]):.3f}' for k in PCTS)} | | |\n")

rows = list(csv.DictReader(open(os.path.join(out, "cpu.tsv")), delimiter="\t"))
by = {}
for r in rows:
    by.setdefault(r["condition"], {})[int(r["seed"])] = float(r["us_per_request"])
bare = by.get("bare axum", {})
print(f"## CPU per request (us, utime+stime of the app / requests, unscraped runs)\n")
print("| round | bare | axum-prometheus | tailguard | axum-prometheus cost | tailguard cost |")
print("|---|---|---|---|---|---|")
costs = {"axum-prometheus": [], "tailguard": []}
ap, tg = by.get(f"axum-prometheus {series}, no scrape", {}), by.get(f"tailguard {series}, no scrape", {})
for seed in sorted(set(bare) & set(ap) & set(tg)):
    ca, ct = ap[seed] - bare[seed], tg[seed] - bare[seed]
    costs["axum-prometheus"].append(ca)
    costs["tailguard"].append(ct)
    print(f"| {seed} | {bare[seed]:.2f} | {ap[seed]:.2f} | {tg[seed]:.2f} | {ca:+.2f} | {ct:+.2f} |")
ca, ct = med(costs["axum-prometheus"]), med(costs["tailguard"])
print(f"| median | {med(list(bare.values())):.2f} | {med(list(ap.values())):.2f} | {med(list(tg.values())):.2f} | {ca:+.2f} | {ct:+.2f} |\n")
if ca > 0:
    print(f"tailguard's cost / axum-prometheus's cost (medians): {ct / ca:.3f}")
