#!/usr/bin/env python3
"""% of ceiling per case, for harness/report/plots.gp: one row per case from one or more bench JSONs.

usage: python3 harness/report/plot_report.py BENCH_JSON [BENCH_JSON ...] OUTDIR

Writes OUTDIR/plot.dat and OUTDIR/plot_meta.gp (`make plots` then runs harness/report/plots.gp on them).

plot.dat holds one gnuplot data block per panel (a ceiling kind; decode_step's whole steps in panels
of their own, since they are stated against a composite bound), one row per case: a short label
(the family and the name keys that vary within that family in these files), the family, the ceiling
kind's name, the run (the file name up to the first '_'), the suite's % of its ceiling, then one
column per other impl of the same case (in-suite peers) and per external peer (`peer_us_*`).
The suite row of a case is its impl=kernel, else its row without impl=, else the first impl listed.
An in-suite impl is plotted at its own pct_of_ceiling (its work against its ceiling, as the bench
summary states it); most share the suite's ceiling, and a comment line lists those that do not (int2's
dense_bf16 reads bf16 bytes, selective_attn's fwd_only and colsum_only do part of the work).
An external peer is stated against the case's ceiling at its own rate where the peers JSON of its run
gives one (X_peers.json beside X_bench.json, peers.json beside bench.json; torch_peers.py writes the
peer's TFLOPs for its own FLOPs): its TFLOPs / the run's bf16 matrix rate, or its GBps / the run's
rate for the case's ceiling. Without one it is put on the suite's yardstick, ceiling_us of the suite
row / the peer's median_us * 100 (the assumption that it does the same work), and a comment line
says so.
Values above 100% are kept and flagged in a comment: the ceiling (or, for a peer, the assumption that
it does the same work) is wrong.
A case in several files is taken whole from the last file that has it (later files are newer runs);
cases with an error_message are skipped and listed. Exits 1 when no case has a % of ceiling.
plot_meta.gp holds what the plot needs from the JSON contexts (GPU, dates, revisions, measured
ceilings) and the panels' sizes and columns, as gnuplot assignments.
Stdlib only, so it runs wherever the results are copied.
"""
import json
import math
import os
import sys

# harness/core/op.h kvb_ceiling_kind, in enum order; names as harness/core/ceilings.c kvb_ceiling_name()
CEILING_NAMES = ["none", "pinned H2D copy", "device copy", "bf16 matrix rate", "device read",
                 "device read, pinned H2D overlapped"]
# the context keys (harness/core/bench.c) that give each kind's measured rate, for the panel titles
CEILING_CONTEXT = {
    1: [("ceiling_h2d_memcpy_GBps", "GB/s")],
    2: [("ceiling_d2d_memcpy_GBps", "GB/s")],
    3: [("ceiling_bf16_mma_TFLOPs", "TFLOP/s")],
    4: [("ceiling_read_GBps", "GB/s")],
    5: [("ceiling_read_GBps", "GB/s"), ("ceiling_h2d_memcpy_GBps", "GB/s")],
}
# whole decode steps: a composite bound (weights, then KV and host bytes), not one kernel's ceiling
STEP_FAMILIES = {"decode_step"}
PEER_PREFIX = "peer_us_"
SUITE_IMPL = "kernel"


def parse_name(name):
    """'fam k=v ... impl=x/manual_time' -> (fam, [(k, v), ...] without impl, impl or None)."""
    words = name.split("/", 1)[0].split()
    keys, impl = [], None
    for w in words[1:]:
        k, _, v = w.partition("=")
        if k == "impl":
            impl = v
        else:
            keys.append((k, v))
    return (words[0] if words else ""), keys, impl


def is_aggregate(b):
    return b.get("run_type") == "aggregate" or "aggregate_name" in b


def run_name(path):
    """results/.../bench3_topk_bench.json -> bench3_topk: the file, short enough for a column."""
    base = os.path.basename(path)
    base = base[:-len(".json")] if base.endswith(".json") else base
    return base[:-len("_bench")] if base.endswith("_bench") and len(base) > len("_bench") else base


def short_value(v):
    """131072 -> 128K, 2097152 -> 2M: sizes read faster in powers of 1024; anything else as written."""
    try:
        n = int(v)
    except ValueError:
        return v
    for div, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= div and n % div == 0:
            return "%d%s" % (n // div, suffix)
    return v


def fmt(x):
    return "NaN" if x is None or not math.isfinite(x) else "%.2f" % x


def peers_path(path):
    """run1_bench.json -> run1_peers.json, bench.json -> peers.json (the run's external peers)."""
    d, base = os.path.split(path)
    return os.path.join(d, base[:-len("bench.json")] + "peers.json") if base.endswith("bench.json") else None


def load_peers(path):
    p = peers_path(path)
    if not p or not os.path.exists(p):
        return []
    with open(p) as f:
        return json.load(f).get("peers", [])


# the context key of each ceiling kind's rate, and the peer entry's field in the same unit
PEER_RATE = {1: ("ceiling_h2d_memcpy_GBps", "GBps"), 2: ("ceiling_d2d_memcpy_GBps", "GBps"),
             3: ("ceiling_bf16_mma_TFLOPs", "TFLOPs"), 4: ("ceiling_read_GBps", "GBps")}


def peer_own_pct(c, fam, keys, name, kind):
    """The peer's own rate as % of the run's rate for this ceiling kind, or None."""
    if kind not in PEER_RATE:
        return None
    ctx_key, field = PEER_RATE[kind]
    try:
        ceiling = float(c["ctx"][ctx_key])
    except (KeyError, ValueError):
        return None
    kv = dict(keys)
    for e in c.get("peers", []):
        if (e.get("kernel") == fam and e.get("peer") == name and field in e
                and all(str(v) == kv.get(k) for k, v in e.get("match", {}).items())):
            return 100.0 * e[field] / ceiling if ceiling > 0 else None
    return None


def load(paths):
    """Cases keyed by (family, keys): {'run', 'ctx', 'rows': {impl: benchmark}, 'impls': [impl, ...]}.
    A case in several files comes whole from the newest run (the context's date; the later file on a
    tie or without dates), so a row's values never mix runs."""
    cases, contexts, replaced = {}, [], []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        ctx = doc.get("context", {})
        run = run_name(path)
        peers = load_peers(path)
        contexts.append((run, ctx))
        here = {}
        for b in doc.get("benchmarks", []):
            if is_aggregate(b) or "name" not in b:
                continue
            fam, keys, impl = parse_name(b["name"])
            c = here.setdefault((fam, tuple(keys)), {"run": run, "ctx": ctx, "rows": {}, "impls": [],
                                                     "date": str(ctx.get("date", "")), "peers": peers})
            c["rows"][impl] = b
            c["impls"].append(impl)
        for key, c in here.items():
            old = cases.get(key)
            if old and old["date"] > c["date"]:
                replaced.append("%s (%s kept over %s: newer)" % (case_text(key), old["run"], run))
                continue
            if old:
                replaced.append("%s (%s replaced by %s)" % (case_text(key), old["run"], run))
            cases[key] = c
    return cases, contexts, replaced


def case_text(key):
    fam, keys = key
    return " ".join([fam] + ["%s=%s" % kv for kv in keys])


def suite_impl(c):
    if SUITE_IMPL in c["rows"]:
        return SUITE_IMPL
    if None in c["rows"]:
        return None
    return c["impls"][0]


def kind_name(kind):
    return CEILING_NAMES[kind] if 0 <= kind < len(CEILING_NAMES) else "ceiling kind %d" % kind


def panel_of(fam, kind):
    name = kind_name(kind)
    return ("%s: whole steps, %s bound" % (fam, name)) if fam in STEP_FAMILIES else name


def build(cases):
    """Rows per panel, the other-impl and peer columns, and the comment lines."""
    skipped, over, own_ceiling, same_work = [], [], [], []
    rows = []
    for key, c in cases.items():
        fam, keys = key
        for impl, b in c["rows"].items():
            if "error_message" in b:
                skipped.append("%s impl=%s: %s" % (case_text(key), impl or "-", b["error_message"].replace("\n", " ")))
        s_impl = suite_impl(c)
        s = c["rows"][s_impl]
        if "error_message" in s or "pct_of_ceiling" not in s or "ceiling_us" not in s:
            if "error_message" not in s:
                skipped.append("%s impl=%s: no pct_of_ceiling (no ceiling measured)" % (case_text(key), s_impl or "-"))
            continue
        kind = int(s.get("ceiling_kind", 0))
        ceiling_us = s["ceiling_us"]
        values = {}
        for impl, b in c["rows"].items():
            if impl == s_impl or "error_message" in b or not b.get("median_us"):
                continue
            # an impl of the suite states its own work against its own ceiling (as the bench summary
            # does); the suite's yardstick only where it has none
            on_suite = 100.0 * ceiling_us / b["median_us"]
            values["impl=" + impl] = b.get("pct_of_ceiling", on_suite)
            own = b.get("ceiling_us")
            if own and abs(own / ceiling_us - 1) > 0.01:
                own_ceiling.append("%s impl=%s: %.1f%% of its own ceiling (plotted), %.1f%% on the suite's" % (
                    case_text(key), impl, values["impl=" + impl], on_suite))
        for k, v in s.items():
            if k.startswith(PEER_PREFIX) and isinstance(v, (int, float)) and v > 0:
                name = k[len(PEER_PREFIX):]
                own = peer_own_pct(c, fam, keys, name, kind)
                values[name] = own if own is not None else 100.0 * ceiling_us / v
                if own is None:
                    same_work.append("%s: %s on the suite's work (no rate of its own in the run's peers JSON)" % (
                        case_text(key), name))
        rows.append({"key": key, "fam": fam, "keys": keys, "run": c["run"], "kind": kind,
                     "panel": panel_of(fam, kind), "pct": s["pct_of_ceiling"], "values": values,
                     "suite": s_impl or "-"})
        for name, v in [("suite impl=%s" % (s_impl or "-"), s["pct_of_ceiling"])] + sorted(values.items()):
            if v > 100.0:
                over.append("%s: %s at %.1f%%" % (case_text(key), name, v))
    return rows, skipped, over, own_ceiling, same_work


def labels(rows):
    """Family plus the keys whose values differ between that family's rows (a step panel's title
    names its family: its labels leave it out)."""
    varying = {}
    for fam in {r["fam"] for r in rows}:
        seen = {}
        for r in rows:
            if r["fam"] == fam:
                for k, v in r["keys"]:
                    seen.setdefault(k, set()).add(v)
        varying[fam] = {k for k, vs in seen.items() if len(vs) > 1}
    for r in rows:
        r["varying"] = [(k, v) for k, v in r["keys"] if k in varying[r["fam"]]]
        words = [] if r["fam"] in STEP_FAMILIES else [r["fam"]]
        r["label"] = " ".join(words + ["%s=%s" % (k, short_value(v)) for k, v in r["varying"]]) or r["fam"]


def sort_key(r):
    """Within a family: by the varying keys in the name's order, numbers as numbers."""
    out = []
    for _, v in r["varying"]:
        try:
            out.append((0, float(v), ""))
        except ValueError:
            out.append((1, 0.0, v))
    return out


def gp_str(s):
    return '"%s"' % s.replace("\\", "\\\\").replace('"', '\\"')


def context_text(contexts):
    gpus = sorted({str(ctx.get("gpu", "unknown GPU")) for _, ctx in contexts})
    runs = ["%s %s %s" % (run, ctx.get("kvbench_git_revision", "?"), str(ctx.get("date", "?"))[:16].replace("T", " "))
            for run, ctx in contexts]
    return gpus, runs


def ceiling_text(kind, contexts):
    """'4527-4624 GB/s' from the runs' contexts (strings in Google Benchmark's context)."""
    parts = []
    for key, unit in CEILING_CONTEXT.get(kind, []):
        vals = []
        for _, ctx in contexts:
            try:
                vals.append(float(ctx[key]))
            except (KeyError, ValueError):
                pass
        if vals:
            lo, hi = min(vals), max(vals)
            what = "read" if "read" in key else "H2D" if "h2d" in key else "copy" if "d2d" in key else "GEMM"
            parts.append("%s %s %s" % (what, ("%.0f" % lo) if lo == hi or "%.0f" % lo == "%.0f" % hi else "%.0f-%.0f" % (lo, hi), unit))
    return ", ".join(parts)


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    paths, outdir = argv[1:-1], argv[-1]
    cases, contexts, replaced = load(paths)
    rows, skipped, over, own_ceiling, same_work = build(cases)
    if not rows:
        sys.stderr.write("plot_report: no usable case in %s (none has a pct_of_ceiling without an error_message;"
                         " a bench run without a GPU times nothing)\n" % " ".join(paths))
        for s in skipped:
            sys.stderr.write("  skipped: %s\n" % s)
        return 1
    gpus, runs = context_text(contexts)
    if len(gpus) > 1:
        sys.stderr.write("plot_report: the files come from several GPUs (%s): one plot per GPU\n" % ", ".join(gpus))
        return 1
    labels(rows)

    # panels in order of first appearance; rows within a panel grouped by family
    panels = []
    for r in rows:
        if r["panel"] not in panels:
            panels.append(r["panel"])
    fam_order = []
    for r in rows:
        if r["fam"] not in fam_order:
            fam_order.append(r["fam"])
    rows.sort(key=lambda r: (panels.index(r["panel"]), fam_order.index(r["fam"]), sort_key(r)))
    # columns: in-suite impls first, then external peers, each in order of first appearance
    cols = []
    for inside in (True, False):
        for r in rows:
            for name in r["values"]:
                if name.startswith("impl=") == inside and name not in cols:
                    cols.append(name)

    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "plot.dat"), "w") as f:
        f.write("# %% of ceiling per case, written by harness/report/plot_report.py from: %s\n" % " ".join(paths))
        f.write("# GPU: %s; runs (file, revision, date): %s\n" % (gpus[0], "; ".join(runs)))
        f.write("# suite = the case's impl=kernel (else its only impl); impl=x: that impl's own pct_of_ceiling; external peers: their own rate (the run's peers JSON) / the run's ceiling rate, else the suite's ceiling_us / the peer's median_us * 100 (listed below)\n")
        f.write("# one block per panel (gnuplot index 0, 1, ...); columns: label family ceiling run suite %s\n" % " ".join(cols))
        for s in over:
            f.write("# ABOVE 100%% (kept, not clipped: the ceiling, or a peer's same-work assumption, is wrong): %s\n" % s)
        for s in own_ceiling:
            f.write("# own ceiling differs: %s\n" % s)
        for s in same_work:
            f.write("# peer on the suite's yardstick: %s\n" % s)
        for s in replaced:
            f.write("# superseded by a newer run: %s\n" % s)
        for s in skipped:
            f.write("# skipped (error): %s\n" % s)
        for p, panel in enumerate(panels):
            if p:
                f.write("\n\n")
            f.write("# panel %d: %s\n" % (p, panel))
            for r in rows:
                if r["panel"] == panel:
                    f.write("%s %s %s %s %s %s\n" % (gp_str(r["label"]), r["fam"], gp_str(kind_name(r["kind"])), r["run"],
                                                     fmt(r["pct"]), " ".join(fmt(r["values"].get(c)) for c in cols)))

    # the plot's text and layout; the columns a panel has data in, so its key lists only those
    with open(os.path.join(outdir, "plot_meta.gp"), "w") as f:
        f.write("# written by harness/report/plot_report.py with plot.dat; loaded by harness/report/plots.gp\n")
        f.write("gpu = %s\n" % gp_str(gpus[0]))
        f.write("runs = %s\n" % gp_str("; ".join(runs)))
        per_line = 3  # runs per title line
        chunks = ["; ".join(runs[i:i + per_line]) for i in range(0, len(runs), per_line)]
        f.write("array run_lines[%d]\n" % len(chunks))
        for i, ch in enumerate(chunks):
            f.write("run_lines[%d] = %s\n" % (i + 1, gp_str(ch)))
        f.write("n_cases = %d\n" % len(rows))
        f.write("max_pct = %s\n" % fmt(max([r["pct"] for r in rows] + [v for r in rows for v in r["values"].values()])))
        f.write("n_over = %d\n" % len(over))
        f.write("n_skipped = %d\n" % len(skipped))
        f.write("n_panels = %d\n" % len(panels))
        f.write("array panel_title[%d]\narray panel_rows[%d]\narray panel_cols[%d]\n" % ((len(panels),) * 3))
        for p, panel in enumerate(panels):
            prow = [r for r in rows if r["panel"] == panel]
            kinds = sorted({r["kind"] for r in prow})
            rate = "; ".join(t for t in (ceiling_text(k, contexts) for k in kinds) if t)
            title = "%s%s" % (panel, " (measured: %s)" % rate if rate else "")
            f.write("panel_title[%d] = %s\n" % (p + 1, gp_str(title)))
            f.write("panel_rows[%d] = %d\n" % (p + 1, len(prow)))
            present = [str(6 + i) for i, c in enumerate(cols) if any(c in r["values"] for r in prow)]
            f.write("panel_cols[%d] = %s\n" % (p + 1, gp_str(" ".join(present))))
        f.write("n_cols = %d\n" % len(cols))
        f.write("array col_name[%d]\narray col_inside[%d]\n" % (max(len(cols), 1), max(len(cols), 1)))
        for i, c in enumerate(cols):
            f.write("col_name[%d] = %s\n" % (i + 1, gp_str(c)))
            f.write("col_inside[%d] = %d\n" % (i + 1, 1 if c.startswith("impl=") else 0))

    print("plot_report: %d cases in %d panels, %d peer columns -> %s/plot.dat (%d above 100%%, %d skipped, %d superseded)"
          % (len(rows), len(panels), len(cols), outdir, len(over), len(skipped), len(replaced)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
