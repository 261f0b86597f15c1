#!/usr/bin/env python3
"""ncu_pc_regions.py SASS_CSV CUTS [TOP]: Nsight Compute's per-instruction warp-state samples of one
kernel, summed over address ranges.

SASS_CSV is `ncu -i REPORT --page source --csv --print-source sass` (plain or .xz), a report captured
with --section SourceCounters (and WarpStateStats). CUTS names the ranges by their first offset from
the kernel's start, e.g. "prologue=0,steps=0x7680,merge=0xde00" (read the offsets from
`cuobjdump --dump-sass` of the same build). Prints, per range: its samples, their share of the
kernel's, the warp instructions executed there and the leading stall reasons; then the TOP (default
20) instructions with the most samples. A sample is one warp's state at one sampling tick, so a
range's share of the samples is its share of the warps' resident time."""
import collections
import csv
import io
import lzma
import sys


def rows_of(path):
    raw = lzma.open(path, "rt") if path.endswith(".xz") else open(path, newline="")
    rows = list(csv.reader(raw))
    return rows[1], rows[2:]  # rows[0] names the kernel


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    head, data = rows_of(sys.argv[1])
    cuts = []
    for part in sys.argv[2].split(","):
        name, _, off = part.partition("=")
        cuts.append((int(off, 0), name))
    cuts.sort()
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    col = {k: i for i, k in enumerate(head)}
    reasons = [k for k in head if k.startswith("stall_") and "Not Issued" not in k]
    base = int(data[0][col["Address"]], 16)
    per = collections.defaultdict(collections.Counter)
    executed = collections.Counter()
    hot = []
    for r in data:
        off = int(r[col["Address"]], 16) - base
        name = next((n for o, n in reversed(cuts) if off >= o), cuts[0][1])
        executed[name] += int(r[col["Instructions Executed"]] or 0)
        stalls = {k[6:]: int(r[col[k]] or 0) for k in reasons if int(r[col[k]] or 0)}
        per[name].update(stalls)
        hot.append((int(r[col["Warp Stall Sampling (All Samples)"]] or 0), off, r[col["Source"]].strip(), stalls))
    total = sum(sum(c.values()) for c in per.values())
    print("| range | from | samples | share | warp instructions | leading stall reasons (samples) |")
    print("|---|---|---:|---:|---:|---|")
    for off, name in cuts:
        c = per[name]
        n = sum(c.values())
        lead = ", ".join("%s %d" % kv for kv in c.most_common(5))
        print("| %s | %#x | %d | %.1f%% | %d | %s |" % (name, off, n, 100.0 * n / max(total, 1), executed[name], lead))
    print("\ntop %d instructions by samples (offset, SASS, stall reasons):" % top)
    for n, off, src, stalls in sorted(hot, key=lambda h: -h[0])[:top]:
        print("%6d  %#7x  %-48s %s" % (n, off, src[:48], stalls))


if __name__ == "__main__":
    main()
