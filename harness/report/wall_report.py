#!/usr/bin/env python3
"""wall_report.py CHECK_OR_BENCH.json [...] [--out F.md] [--top N]

Where a run's wall time went: the total of each phase (inputs, reference, upload, validate, timing,
revalidate) over every case of each file, the kernels that took the most, and the slowest cases with
their phases. Reads `kvbench check --json` (each case's "wall_s") and `kvbench bench --json` (each
benchmark's wall_<phase>_s counters); a merged file reads the same. Standard library only.
"""
import argparse
import json
import sys

PHASES = ["inputs", "reference", "upload", "validate", "timing", "revalidate"]


def cases_of(path):
    with open(path) as f:
        d = json.load(f)
    if "cases" in d:  # kvbench check
        for c in d["cases"]:
            w = c.get("wall_s") or {}
            yield "check", c["id"], {p: float(w.get(p) or 0) for p in PHASES}
    else:  # kvbench bench (Google Benchmark's JSON)
        for b in d.get("benchmarks", []):
            name = b.get("run_name") or b.get("name", "")
            cid = name.split("/iterations:")[0]
            yield "bench", cid, {p: float(b.get("wall_%s_s" % p) or 0) for p in PHASES}


def fmt_s(x):
    return "%.1f" % x


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", help="write the report here (markdown) as well as to stdout")
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    rows, lines = [], []
    for path in a.files:
        try:
            rows += [(cmd, cid, w, path) for cmd, cid, w in cases_of(path)]
        except (OSError, ValueError, KeyError) as e:
            print("wall_report: %s: %s" % (path, e), file=sys.stderr)
            return 2
    for cmd in ("check", "bench"):
        sel = [r for r in rows if r[0] == cmd]
        if not sel:
            continue
        tot = {p: sum(r[2][p] for r in sel) for p in PHASES}
        lines.append("### %s: %d cases, %s s of case wall time" % (cmd, len(sel), fmt_s(sum(tot.values()))))
        lines.append("")
        lines.append("| " + " | ".join(PHASES) + " |")
        lines.append("|" + "---:|" * len(PHASES))
        lines.append("| " + " | ".join(fmt_s(tot[p]) for p in PHASES) + " |")
        lines.append("")
        by_kernel = {}
        for r in sel:
            k = r[1].split()[0]
            by_kernel[k] = by_kernel.get(k, 0) + sum(r[2].values())
        top_k = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:8]
        lines.append("Kernels that took the most: " + ", ".join("%s %s s" % (k, fmt_s(v)) for k, v in top_k) + ".")
        lines.append("")
        lines.append("The %d slowest cases (seconds):" % a.top)
        lines.append("")
        lines.append("| case | total | " + " | ".join(PHASES) + " |")
        lines.append("|---|---:|" + "---:|" * len(PHASES))
        for r in sorted(sel, key=lambda r: -sum(r[2].values()))[: a.top]:
            lines.append("| `%s` | %s | " % (r[1], fmt_s(sum(r[2].values())))
                         + " | ".join(fmt_s(r[2][p]) for p in PHASES) + " |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
