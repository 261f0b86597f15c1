#!/usr/bin/env python3
"""round_index.py RESULTS_DIR: the index entry of one canonical round, written into results/README.md
between <!-- round:begin GPU --> and <!-- round:end GPU --> (GPU: the directory's name, e.g. h200).

Everything in the entry is read from the round's own files: the device and kvbench revision (bench.json's
context, device.txt), when and how long each phase ran (round.log), the check verdicts (check.json), the
sanitizers' verdicts (sanitize.txt) and how many bench cases were timed (bench.json).
"""
import json
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def check_counts(path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    cases = d.get("cases", [])
    verdict = {}
    for c in cases:
        v = c.get("status", "?")
        verdict[v] = verdict.get(v, 0) + 1
    # check --determinism: "deterministic" on every case launched twice; false where the kernel declared
    # its bits vary ("nondeterministic", the reason) and the relaunch was validated instead
    relaunched = [c for c in cases if "deterministic" in c]
    varying = [c for c in relaunched if not c["deterministic"]]
    return len(cases), verdict, len(relaunched), len(varying)


def sanitize_verdicts(text):
    """One verdict a tool from sanitize.txt's lines "sanitize TOOL: exit N; ...": its exit code, its cases
    passed and failed (or "no case summary" where the tool ended the pass early) and what it found."""
    verdicts = []
    for l in text.splitlines():
        m = re.match(r"sanitize (\w+): exit (\d+); (.*)$", l)
        if not m:
            continue
        passed = "+".join(re.findall(r"(\d+) passed", m.group(3)))
        san_failed = sum(int(x) for x in re.findall(r"(\d+) failed", m.group(3)))
        cases = "%s cases passed, %d failed" % (passed, san_failed) if passed else "no case summary"
        found = sorted(set(re.findall(r"(\d+ errors?\b|\d+ hazards?\b|\d+ bytes leaked)", m.group(3))))
        verdicts.append("%s exit %s (%s; %s)" % (m.group(1), m.group(2), cases, ", ".join(found) or "no summary"))
    return verdicts


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    res = os.path.abspath(sys.argv[1])
    gpu = os.path.basename(res)
    rel = os.path.relpath(res, os.path.join(ROOT, "results"))
    lines = []
    ctx = {}
    try:
        with open(os.path.join(res, "bench.json")) as f:
            bench = json.load(f)
        ctx = bench.get("context", {})
        timed = [b for b in bench.get("benchmarks", []) if "median_us" in b]
        failed = [b for b in bench.get("benchmarks", []) if b.get("error_occurred")]
    except (OSError, ValueError):
        bench, timed, failed = None, [], []
    dev = read(os.path.join(res, "device.txt")).strip().splitlines()
    lines.append("**%s** (`%s/`): %s when the bench began, driver %s, kvbench %s." % (
        ctx.get("gpu", "unknown GPU"), rel, ctx.get("gpu_clocks", "clocks not recorded"),
        ctx.get("gpu_driver", "?"), ctx.get("kvbench_git_revision", "?")))
    if dev:
        lines.append("")
        lines.append("`device.txt`, written before the round's first phase (the SM clock is the idle GPU's):")
        lines.append("")
        lines.append("```")
        lines += dev[:4]
        lines.append("```")
    log = read(os.path.join(res, "round.log"))
    # a round may be made of several calls of gpu_round.sh (phases selected by TESTS=, CHECK=, ...):
    # round.log is their logs one after the other, each ending with its "round: N s in all"
    phases = [p for p in re.findall(r"^\[(\S+)\] (\w+): exit (\d+), (\d+) s$", log, re.M) if p[1] != "device"]
    totals = [int(t) for t in re.findall(r"^\[\S+\] round: (\d+) s in all$", log, re.M)]
    start = re.search(r"^\[(\S+)\] \w+: start$", log, re.M)
    if phases:
        lines.append("")
        lines.append("Ran %s%s%s: %s." % (
            start.group(1) if start else phases[0][0],
            ", %.1f minutes in all" % (sum(totals) / 60.0) if totals else "",
            " in %d calls of `gpu_round.sh`" % len(totals) if len(totals) > 1 else "",
            ", ".join("%s %s s (exit %s)" % (p[1], p[3], p[2]) for p in phases)))
    # gpu_round.sh lists the compute processes already on the GPU before a phase: another's work
    others = re.findall(r"^\[\S+\] (\w+): other compute processes on the GPU: (.*)$", log, re.M)
    if others:
        lines.append("")
        lines.append("Other compute processes were on the GPU before %s: the phase's times may be shared." % (
            "; ".join("%s (%s)" % (name, procs) for name, procs in others)))
    lines.append("")
    cc = check_counts(os.path.join(res, "check.json"))
    if cc:
        n, v, relaunched, varying = cc
        det = ""
        if relaunched:
            det = "; with `--determinism`, %d launched twice: %d bitwise equal, %d whose kernel declares its bits vary" \
                  " (`nondeterministic`, the reason) with the second launch validated" % (relaunched, relaunched - varying, varying)
        lines.append("- `check.json`: %d check cases: %s%s." % (
            n, ", ".join("%d %s" % (k, name) for name, k in sorted(v.items())), det))
    verdicts = sanitize_verdicts(read(os.path.join(res, "sanitize.txt")))
    if verdicts:
        lines.append("- `sanitize.txt`: compute-sanitizer over the sanitize tier (memcheck also the smoke tier): " +
                     "; ".join(verdicts) + ".")
    if bench is not None:
        lines.append("- `bench.json`, `summary.md`: %d cases timed, each validated before and after timing%s; "
                     "external peers in `peers.json`, timed in the same round." % (
                         len(timed), ", %d failed" % len(failed) if failed else ""))
    tests = re.findall(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", read(os.path.join(res, "tests.log")), re.M)
    if tests:
        p, f, s = tests[-1]
        elsewhere = "KVB_TEST_GPU_CASES=0" in read(os.path.join(res, "tests.log"))
        lines.append("- `tests.log`: the test programs on the GPU: %s passed, %s failed%s%s." % (
            p, f, ", %s skipped" % s if s else "",
            " (their per-case tests of the check tier left to the check, which runs it with --determinism)"
            if elsewhere else ""))
    lines.append("- `pct_of_ceiling.png`: each case's % of its ceiling with its peers (`make plots`).")
    notes = read(os.path.join(res, "round_notes.md")).strip()  # the publisher's notes on this round, if any
    if notes:
        lines += ["", notes]
    body = "\n".join(lines)
    path = os.path.join(ROOT, "results", "README.md")
    text = read(path)
    begin, end = "<!-- round:begin %s -->" % gpu, "<!-- round:end %s -->" % gpu
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        sys.exit("round_index: results/README.md has no %s ... %s block" % (begin, end))
    with open(path, "w") as f:
        f.write(text[: i + len(begin)] + "\n" + body + "\n" + text[j:])
    print("round_index: wrote results/README.md (%s)" % gpu)


if __name__ == "__main__":
    main()
