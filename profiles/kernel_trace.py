#!/usr/bin/env python3
"""kernel_trace.py TRACE.csv[.gz] [--stream-summary]: the timeline that profiles/kernel_trace.c recorded
between cuProfilerStart and cuProfilerStop (one launch of `kvbench profile CASE`).

Prints every kernel, copy and memset of the window in start order: start and end in us from the window's
first activity, duration, stream, blocks, name. Then per stream: busy time (union of its activities),
first start, last end, and the idle gaps of at least 1 us between its activities; and the window's span.
A name filter (--match SUBSTRING, repeatable) sums the listed activities' time and prints their gaps."""
import argparse
import gzip


def read_trace(path):
    opener = gzip.open if path.endswith(".gz") else open
    marks, acts = {}, []
    with opener(path, "rt") as f:
        for line in f:
            p = line.rstrip("\n").split(",", 6)
            if p[0] in ("profiler_start", "profiler_stop"):
                marks.setdefault(p[0], []).append(int(p[1]))
            elif p[0] == "kernel":
                acts.append(dict(kind="kernel", start=int(p[1]), end=int(p[2]), stream=int(p[3]), blocks=int(p[4]),
                                 name=p[6]))
            elif p[0] in ("memcpy", "memset"):
                acts.append(dict(kind=p[0], start=int(p[1]), end=int(p[2]), stream=int(p[3]), blocks=0,
                                 name="%s %s bytes" % (p[0], p[4])))
    return marks, acts


def short(name, width=70):
    base = name.split("(")[0]
    return base if len(base) <= width else base[: width - 3] + "..."


def union_us(spans):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total / 1e3


def gaps(spans, min_us=1.0):
    out, last = [], None
    for s, e in sorted(spans):
        if last is not None and (s - last) / 1e3 >= min_us:
            out.append((last, s))
        last = e if last is None else max(last, e)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--match", action="append", default=[], help="name substring to sum (repeatable)")
    a = ap.parse_args()
    marks, acts = read_trace(a.trace)
    if "profiler_start" not in marks or "profiler_stop" not in marks:
        raise SystemExit("no profiler marks in %s" % a.trace)
    t0, t1 = marks["profiler_start"][-1], marks["profiler_stop"][-1]
    win = sorted((x for x in acts if x["start"] >= t0 and x["end"] <= t1), key=lambda x: x["start"])
    if not win:
        raise SystemExit("no activity between the profiler marks")
    base = win[0]["start"]
    rel = lambda t: (t - base) / 1e3
    print("%9s %9s %8s %6s %7s  %s" % ("start_us", "end_us", "dur_us", "stream", "blocks", "name"))
    for x in win:
        print("%9.1f %9.1f %8.1f %6d %7d  %s" % (rel(x["start"]), rel(x["end"]), (x["end"] - x["start"]) / 1e3,
                                                 x["stream"], x["blocks"], short(x["name"])))
    span = rel(max(x["end"] for x in win))
    print("\nwindow: %d activities, %.1f us from the first start to the last end" % (len(win), span))
    for s in sorted({x["stream"] for x in win}):
        sp = [(x["start"], x["end"]) for x in win if x["stream"] == s]
        g = gaps(sp)
        print("stream %d: %d activities, busy %.1f us, %.1f-%.1f us, %d gaps >= 1 us summing %.1f us" %
              (s, len(sp), union_us(sp), rel(min(p[0] for p in sp)), rel(max(p[1] for p in sp)), len(g),
               sum(e - b for b, e in g) / 1e3))
    for m in a.match:
        sel = [x for x in win if m in x["name"]]
        if not sel:
            print("match %r: none" % m)
            continue
        sp = [(x["start"], x["end"]) for x in sel]
        g = gaps(sp)
        print("match %r: %d activities, summed %.1f us, union %.1f us, %.1f-%.1f us; gaps: %s" %
              (m, len(sel), sum(x["end"] - x["start"] for x in sel) / 1e3, union_us(sp), rel(min(p[0] for p in sp)),
               rel(max(p[1] for p in sp)), ", ".join("%.1f-%.1f" % (rel(b), rel(e)) for b, e in g) or "none"))


if __name__ == "__main__":
    main()
