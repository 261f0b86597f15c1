#!/usr/bin/env python3
"""Random shapes through the whole check path: every kernel and impl at seeded draws of its keys.

The parser fuzzers (fuzz_cases.c, fuzz_cli.c) stop before anything is allocated; this sweep goes on
to what they leave out: set-up, the references, the CUDA launches and the comparisons, at shapes no
case file names. For each kernel it draws key values from `kvbench kernels --json` (the keys' own
ranges, biased to small sizes and to the range's ends, or the values a key lists), asks `kvbench list
--lines` whether the line is accepted and what it costs, keeps accepted lines up to a check cost and
a host memory bound, and runs them with `kvbench check`, one process a kernel (a crash then names its kernel, and each of that
kernel's cases is run again alone to name the case).

What it holds kvbench to (README.md, "Cases"): every accepted line runs and passes (PASS, or SKIP
without a device); a refusal names the key; no input ends the process by a signal, a hang or an
exit other than 0 and 1. Without a GPU the references and their invariants still run.

usage: gpu_sweep.py KVBENCH OUT [--per-kernel N] [--seed S] [--max-cost SEC] [--max-host-mb MB]
                    [--kernels a,b,...] [--timeout SEC] [--wrap "compute-sanitizer --tool memcheck ..."]
                    [--draw-only | --from SWEEP.cases]
Drawing asks one `kvbench list --lines --costs` about 64 lines at a time (24 lines of every kernel: about 40 s
on two cores); --draw-only and --from draw on one machine and check the same lines on another.
-> OUT/sweep.cases (the drawn lines), OUT/<kernel>.json and .log (kvbench check), OUT/sweep.md (verdicts),
   last line "gpu sweep: N passed, N failed, N skipped"; exit 1 when a case failed or crashed.
"""
import argparse
import json
import math
import os
import random
import re
import shlex
import subprocess
import sys


def draw_int(rng, key):
    lo, hi, default = int(key["lo"]), int(key["hi"]), int(key["default"])
    if key.get("choices"):  # a key that allows only some values (a kernel's head dimensions) draws one of them
        return int(rng.choice(key["choices"].split("|")))
    if key["name"] == "seed":
        return rng.randint(lo, min(hi, 1000))
    roll = rng.random()
    if roll < 0.15:
        return lo
    if roll < 0.25:
        return min(hi, lo + rng.randint(1, 3))
    # log-uniform up to about the default (the bench size) or 64, whichever is larger
    top = min(hi, max(2 * default, 64))
    base = max(lo, 1)
    if top <= base:
        return base
    v = int(round(math.exp(rng.uniform(math.log(base), math.log(top)))))
    if rng.random() < 0.4:  # sizes that must be multiples (of a group, a tile, a page) get drawn too
        step = 1 << rng.randint(1, 7)
        v = max(step, v // step * step)
    return max(lo, min(hi, v))


def draw_float(rng, key):
    lo, hi, default = float(key["lo"]), float(key["hi"]), float(key["default"])
    if hi - lo <= 16:
        roll = rng.random()
        return lo if roll < 0.1 else hi if roll < 0.2 else rng.uniform(lo, hi)
    scale = default if default > 0 else 1.0
    return max(lo, min(hi, scale * 2 ** rng.uniform(-3, 3)))


# enum values whose cases fail by design: int2's bad-input distribution (a NaN key the quantizer must
# refuse; tests/cli_test.sh holds that case and its expected failure)
FAIL_BY_DESIGN = {("dist", "nonfinite")}
# pairs of values that fail together by design: int2_decode_attn's v1 rounds the dequantized keys to
# fp16 and is outside the tolerance on dist=spiky; a draw that holds both gets the key's default for
# the second
FAIL_BY_DESIGN_PAIRS = {(("impl", "v1"), ("dist", "spiky"))}


def draw_line(rng, kernel):
    keys = {key["name"]: key for key in kernel["keys"]}
    values = {}
    for key in kernel["keys"]:
        if rng.random() < 0.3 and key["name"] != "seed":
            continue  # the default (seed always given: a kernel's name alone would be a filter)
        if key["type"] == "enum":
            value = rng.choice([v for v in key["choices"].split("|") if (key["name"], v) not in FAIL_BY_DESIGN])
        elif key["type"] == "int":
            value = str(draw_int(rng, key))
        else:
            value = "%.6g" % draw_float(rng, key)
        values[key["name"]] = value
    # grouped-query attention: most draws make Hq a multiple of Hkv (G in [1, 8]), as every kernel with both
    # keys requires; the rest keep the independent draw, whose refusal is checked too
    if "Hq" in values and "Hkv" in keys and rng.random() < 0.8:
        hkv = int(values.get("Hkv", keys["Hkv"]["default"]))
        values["Hq"] = str(min(int(keys["Hq"]["hi"]), hkv * rng.randint(1, 8)))
    for (k1, v1), (k2, v2) in FAIL_BY_DESIGN_PAIRS:
        if values.get(k1) == v1 and values.get(k2) == v2:
            del values[k2]
    # a key read only with some values of another (decode_step's budget, rank, hit, role: "only_with") keeps
    # its default where the drawn value of that key does not read it, as the parser requires
    for key in kernel["keys"]:
        if key["name"] in values and key.get("only_with"):
            cond, users = key["only_with"].split("=", 1)
            if values.get(cond, keys[cond]["default"]) not in users.split("|"):
                del values[key["name"]]
    return " ".join([kernel["name"]] + ["%s=%s" % kv for kv in values.items()])


def run(cmd, timeout):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=timeout)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "timeout", out


def judge(kvbench, scratch, lines):
    """For each line, (id, cost, host_mb) when kvbench accepts it, else (None, refusal message, None): one
    `kvbench list --lines` over them all."""
    with open(scratch, "w") as f:
        f.writelines(line + "\n" for line in lines)
    rc, out = run([kvbench, "list", "--lines", scratch, "--costs"], 120)
    if rc not in (0, 2):
        return [(None, "list exited %s: %s" % (rc, out.strip()[-300:]), None)] * len(lines)
    verdicts = {}
    for row in out.splitlines():
        fields = row.split(None, 4)
        if len(fields) >= 3 and fields[0].isdigit():
            n = int(fields[0])
            if fields[1] == "refused":
                verdicts[n] = (None, row.split(None, 2)[2], None)
            elif len(fields) == 5:
                verdicts[n] = (fields[4].strip(), float(fields[2]), float(fields[3]))
    return [verdicts.get(i + 1, (None, "list exited %s: no verdict for this line" % rc, None))
            for i in range(len(lines))]


def draw_kernel(kvbench, scratch, kernel, args, rng):
    """Up to args.per_kernel accepted, affordable, distinct case lines; the refusals seen, those that name
    none of the kernel's keys, and lines on which `kvbench list` itself crashed."""
    kept, seen, refusals, silent, crashed, cost_sum = [], set(), {}, [], [], 0.0
    tries = 0
    while len(kept) < args.per_kernel and tries < args.per_kernel * 200:
        lines = [draw_line(rng, kernel) for _ in range(64)]
        tries += len(lines)
        for line, (case_id, cost, host_mb) in zip(lines, judge(kvbench, scratch, lines)):
            if case_id is None:
                msg = cost
                if msg.startswith("list exited"):  # the parser itself ended otherwise than 0 or 2
                    crashed.append((line, msg))
                    continue
                if not any(re.search(r"\b%s\b" % re.escape(k["name"]), msg) for k in kernel["keys"]):
                    silent.append((line, msg))  # a refusal names the key it refuses (README.md)
                # grouped by kind: the message with its numbers as N
                key = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", msg.split(": ", 1)[-1])[:160]
                refusals[key] = refusals.get(key, 0) + 1
                continue
            if case_id in seen or cost > args.max_cost or host_mb > args.max_host_mb:
                continue
            seen.add(case_id)
            kept.append(case_id)
            cost_sum += cost
            if len(kept) == args.per_kernel:
                break
    return kept, refusals, tries, silent, cost_sum, crashed


def case_verdicts(path):
    try:
        with open(path) as f:
            return {c["id"]: c for c in json.load(f).get("cases", [])}
    except (OSError, ValueError):
        return {}


def check_cases(kvbench, out, name, lines, args):
    """kvbench check over lines, one process; on a crash each line again alone.
    Returns {id: (status, detail)}."""
    cases = os.path.join(out, name + ".cases")
    with open(cases, "w") as f:
        f.writelines(line + " tier=check\n" for line in lines)
    report = os.path.join(out, name + ".json")
    cmd = shlex.split(args.wrap) + [kvbench, "check", "--cases", cases, "--json", report]
    rc, log = run(cmd, args.timeout)
    with open(os.path.join(out, name + ".log"), "w") as f:
        f.write(log)
    verdicts = {}
    if rc in (0, 1, 3):  # 3: every case skipped (no device)
        for case_id, c in case_verdicts(report).items():
            verdicts[case_id] = (c["status"], c.get("reason", "") + " " + c.get("note", ""))
        for line in lines:
            verdicts.setdefault(line, ("FAIL", "no verdict in the result file"))
        return verdicts
    for i, line in enumerate(lines):  # the process ended otherwise: each case alone
        one = os.path.join(out, "%s.%d.json" % (name, i))
        rc1, log1 = run(shlex.split(args.wrap) + [kvbench, "check", "--cases", os.devnull, line, "--json", one],
                        args.timeout)
        if rc1 in (0, 1, 3):
            c = case_verdicts(one).get(line)
            verdicts[line] = (c["status"], c.get("reason", "")) if c else ("FAIL", "no verdict")
        else:
            tail = " | ".join(log1.strip().splitlines()[-3:])
            verdicts[line] = ("CRASH", "exit %s: %s" % (rc1, tail[-400:]))
    return verdicts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kvbench")
    ap.add_argument("out")
    ap.add_argument("--per-kernel", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-cost", type=float, default=1.0, help="check cost estimate a case, seconds")
    ap.add_argument("--max-host-mb", type=float, default=2048)
    ap.add_argument("--kernels", default="", help="comma-separated kernel names (default: all)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a kvbench check process")
    ap.add_argument("--wrap", default="", help="a command to run kvbench under (compute-sanitizer ...)")
    ap.add_argument("--draw-only", action="store_true", help="write OUT/sweep.cases and the cost estimate, run nothing")
    ap.add_argument("--from", dest="drawn", default="", help="run the lines of a sweep.cases drawn before")
    ap.add_argument("--strict", action="store_true", help="a refusal that names none of the kernel's keys fails the sweep")
    args = ap.parse_args()
    kvbench = os.path.abspath(args.kvbench)
    os.makedirs(args.out, exist_ok=True)
    scratch = os.path.join(args.out, "drawn.txt")  # the lines kvbench list --lines judges
    table = os.path.join(args.out, "kernels.json")
    rc, log = run([kvbench, "kernels", "--json", table], 60)
    if rc != 0:
        sys.exit("gpu_sweep: kvbench kernels --json failed: %s" % log)
    kernels = json.load(open(table))["kernels"]
    wanted = [k for k in args.kernels.split(",") if k]
    unknown = set(wanted) - {k["name"] for k in kernels}
    if unknown:
        sys.exit("gpu_sweep: unknown kernels: %s" % ", ".join(sorted(unknown)))
    rng = random.Random(args.seed)
    rows, counts, drawn = [], {"PASS": 0, "FAIL": 0, "SKIP": 0, "CRASH": 0}, []
    notes, total_cost, refused_most = [], 0.0, []
    for kernel in kernels:
        if wanted and kernel["name"] not in wanted:
            continue
        if args.drawn:  # lines drawn before, asked again: a build may refuse what an earlier one took
            given = [l.rsplit(" tier=", 1)[0] for l in open(args.drawn) if l.split(" ", 1)[0] == kernel["name"]]
            judged = judge(kvbench, scratch, given) if given else []
            lines = [case_id for case_id, _, _ in judged if case_id is not None]
            refusals, tries, silent, cost = {}, len(given), [], 0.0
            for line, (case_id, msg, _) in zip(given, judged):
                if case_id is None:
                    refusals[msg] = refusals.get(msg, 0) + 1
                    notes.append("%s: now refused: `%s`: %s" % (kernel["name"], line, msg))
        else:
            lines, refusals, tries, silent, cost, crashed = draw_kernel(kvbench, scratch, kernel, args, rng)
            for line, msg in crashed:
                counts["CRASH"] += 1
                rows.append((kernel["name"], "CRASH", line, msg))
        total_cost += cost
        drawn += lines
        if refusals and not args.drawn:  # what the draws of this kernel were refused for, the most frequent first
            top = sorted(refusals.items(), key=lambda kv: -kv[1])[:3]
            refused_most.append("%s (%d of %d tries): %s" % (kernel["name"], sum(refusals.values()), tries,
                                                             "; ".join("%d x `%s`" % (n, m) for m, n in top)))
        for line, msg in silent:
            notes.append("%s: refused without naming a key: `%s`: %s" % (kernel["name"], line, msg))
        run_them = lines and not args.draw_only
        verdicts = check_cases(kvbench, args.out, kernel["name"], lines, args) if run_them else {}
        for case_id, (status, detail) in verdicts.items():
            counts[status] = counts.get(status, 0) + 1
            if status not in ("PASS", "SKIP"):
                rows.append((kernel["name"], status, case_id, detail.strip()))
        print("%-22s %3d drawn of %4d tries (%d refused), %s" % (
            kernel["name"], len(lines), tries, sum(refusals.values()),
            ", ".join("%d %s" % (sum(1 for s, _ in verdicts.values() if s == st), st)
                      for st in ("PASS", "FAIL", "SKIP", "CRASH")
                      if any(s == st for s, _ in verdicts.values())) or "nothing run"), flush=True)
    with open(os.path.join(args.out, "sweep.cases"), "w") as f:
        f.writelines(line + " tier=check\n" for line in drawn)
    with open(os.path.join(args.out, "sweep.md"), "w") as f:
        if args.drawn:
            f.write("# Random-shape sweep: the lines of %s\n\n" % args.drawn)
        else:
            f.write("# Random-shape sweep (seed %d, %d a kernel, check cost <= %g s, host <= %g MB)\n\n"
                    % (args.seed, args.per_kernel, args.max_cost, args.max_host_mb))
        f.write("%s\n\n" % run([kvbench, "--version"], 30)[1].strip())
        f.write("%d passed, %d failed, %d crashed, %d skipped\n\n" % (
            counts["PASS"], counts["FAIL"], counts["CRASH"], counts["SKIP"]))
        for kernel, status, case_id, detail in rows:
            f.write("- %s %s `%s`: %s\n" % (status, kernel, case_id, detail))
        for note in notes:
            f.write("- %s\n" % note)
        if refused_most:
            f.write("\n## Refused draws (the three most frequent kinds a kernel, numbers as N)\n\n")
            f.writelines("- %s\n" % row for row in refused_most)
    print("check cost estimate of the drawn cases: %.0f s" % total_cost)
    for kernel, status, case_id, detail in rows:
        print("%s  %s\n      %s" % (status, case_id, detail[:400]))
    for note in notes:
        print("note: " + note)
    print("gpu sweep: %d passed, %d failed, %d skipped" % (
        counts["PASS"], counts["FAIL"] + counts["CRASH"], counts["SKIP"]))
    silent = sum(1 for n in notes if "refused without naming a key" in n)
    if args.strict and silent:
        print("gpu sweep: %d refusals name none of their kernel's keys (--strict)" % silent)
    sys.exit(1 if counts["FAIL"] or counts["CRASH"] or (args.strict and silent) else 0)


if __name__ == "__main__":
    main()
