"""Percentiles read back from a `tailguard load --hgrm` file (HdrHistogram's percentile
distribution, milliseconds): what the lab scripts' summaries share."""


def hgrm(path):
    """(P50, P99, P99.9, P100) in milliseconds of the .hgrm file at `path`."""
    pts = []
    for line in open(path):
        f = line.split()
        if len(f) >= 4:
            try:
                pts.append((float(f[1]), float(f[0])))
            except ValueError:
                pass

    def p(q):
        for frac, ms in pts:
            if frac >= q:
                return ms
        return pts[-1][1]

    return p(0.5), p(0.99), p(0.999), pts[-1][1]
