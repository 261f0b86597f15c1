#!/usr/bin/env python3
"""Tests of harness/report/step_report.py on synthetic bench files: joins stay inside a run, ShadowKV is set
beside dense only at dense's largest batch, OmniKV's model step is composed from the right layers.
Prints one line "step_report: N passed, N failed" (tests/run_tests.sh sums it)."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# the source tree's harness/, or a bundle's top level (harness/scripts/make_bundle.sh)
SCRIPT = next((p for p in (os.path.join(HERE, "..", "harness", "report", "step_report.py"), os.path.join(HERE, "..", "step_report.py"))
               if os.path.exists(p)), os.path.join(HERE, "..", "harness", "report", "step_report.py"))


def case(method, B, ctx, median, ceiling, **extra):
    keys = "method=%s model=llama3-8b B=%d ctx=%d gen=0" % (method, B, ctx)
    for k in ("role", "budget"):
        if k in extra:
            keys += " %s=%s" % (k, extra.pop(k))
    b = {"name": "decode_step %s impl=kernel/manual_time" % keys, "run_type": "iteration",
         "median_us": median, "ceiling_us": ceiling, "label": "stages: attention 1.0 us",
         "stage_us_attention": 1.0}
    b.update(extra)
    return b


def write(path, cases, **context):
    with open(path, "w") as f:
        json.dump({"context": dict(gpu="TEST GPU", **context), "benchmarks": cases}, f)


def report(files, outdir):
    r = subprocess.run([sys.executable, SCRIPT] + files + [outdir], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    with open(os.path.join(outdir, "tables.md")) as f:
        return f.read()


def rows_after(text, heading):
    """The data rows of the first table after a heading."""
    at = text.index(heading)
    rows = []
    for line in text[at:].splitlines()[1:]:
        if line.startswith("| ") and not line.startswith("| run |") and not line.startswith("| ctx |"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows and not line.startswith("|"):
            break
    return rows


def test_shadowkv_joins_dense_at_its_largest_batch_in_its_run(tmp):
    # run1: dense B=16 is dense's largest batch (max_batch_device 16); B=8 is not, and would flatter
    # shadowkv. run2 has a faster dense B=16 that must not be used for run1's shadowkv.
    write(os.path.join(tmp, "run1_bench.json"), [
        case("shadowkv", 48, 61440, 1000.0, 500.0, budget=1024, max_batch_host=33),
        case("dense", 8, 61440, 900.0, 800.0, max_batch_device=16),
        case("dense", 16, 61440, 1000.0, 900.0, max_batch_device=16),
    ], ceiling_h2d_memcpy_GBps="51.6")
    write(os.path.join(tmp, "run2_bench.json"), [
        case("dense", 16, 61440, 500.0, 450.0, max_batch_device=16),
        case("shadowkv", 24, 124928, 1000.0, 500.0, budget=2048),  # no dense at its largest batch here
        case("dense", 4, 124928, 800.0, 700.0, max_batch_device=8),
    ], ceiling_h2d_memcpy_GBps="40.0")
    # run2 first: a join that ignored runs would find its dense before run1's
    text = report([os.path.join(tmp, "run2_bench.json"), os.path.join(tmp, "run1_bench.json")], tmp)
    rows = rows_after(text, "## ShadowKV against dense")
    assert len(rows) == 1, rows
    r = rows[0]
    # run ctx budget sB s_us dB dmax d_us ratio s_bound d_bound bound_ratio pct host h2d goal met
    assert r[0] == "run1" and r[1] == "60K" and r[3] == "48" and r[5] == "16", r
    assert r[8] == "3.00", r  # (48 / 1000) / (16 / 1000)
    assert r[11] == "5.40", r  # (48 / 500) / (16 / 900)
    assert r[13] == "33" and r[14] == "51.6" and r[15] == ">= 3x" and r[16] == "yes", r  # run1's own link rate


def test_omnikv_composed_within_a_run(tmp):
    # dense 1000 us, filter 2000 us, sparse 100 us: 5*1000 + 3*2000 + 24*100 = 13400 against 32000
    write(os.path.join(tmp, "run1_a_bench.json"), [
        case("omnikv", 8, 131072, 2000.0, 1500.0, role="filter", budget=2048),
        case("omnikv", 8, 131072, 100.0, 50.0, role="sparse", budget=2048),
    ])
    write(os.path.join(tmp, "run1_b_bench.json"), [case("dense", 8, 131072, 1000.0, 900.0)])
    write(os.path.join(tmp, "run2_bench.json"), [case("dense", 8, 131072, 10.0, 9.0)])
    files = [os.path.join(tmp, f) for f in ("run2_bench.json", "run1_a_bench.json", "run1_b_bench.json")]
    text = report(files, tmp)
    rows = rows_after(text, "## OmniKV")
    assert len(rows) == 1, rows
    r = rows[0]
    assert r[0] == "run1" and r[5] == "13400.0" and r[6] == "32000.0", r
    assert r[7] == "2.39", r  # 32000 / 13400
    assert r[-2] == ">= 1.7x" and r[-1] == "yes", r


def test_single_file_has_no_run_column(tmp):
    write(os.path.join(tmp, "bench.json"), [case("dense", 1, 32768, 180.0, 126.0)])
    text = report([os.path.join(tmp, "bench.json")], tmp)
    assert "| run |" not in text, text


def test_fixed_part_against_the_weights(tmp):
    # 400 MB of weights a block at 4000 GB/s: 100 us. Block stages 140 us (high 1.40x); the path
    # (attention + kv_append) 45 us, so the step minus the path is 115 us (1.15x) or 95 us (0.95x)
    stages = {"rmsnorm1": 5, "qkv_proj": 20, "rope": 5, "kv_append": 5, "attention": 40, "o_proj": 15,
              "rmsnorm2": 5, "gate_up_proj": 55, "silu_mul": 5, "down_proj": 30}
    cases = []
    for B, median in ((1, 160.0), (8, 140.0)):
        c = case("dense", B, 32768, median, 126.0, model_weight_bytes=32 * 400e6,
                 tokens_per_s=B / (median * 1e-6 * 32))
        c.update({"stage_us_" + k: float(v) for k, v in stages.items()})
        c["label"] = "stages: " + ", ".join("%s %d us" % kv for kv in stages.items())
        cases.append(c)
    with open(os.path.join(tmp, "bench.json"), "w") as f:
        json.dump({"context": {"gpu": "TEST GPU", "ceiling_read_GBps": "4000.0"}, "benchmarks": cases}, f)
    rows = rows_after(report([os.path.join(tmp, "bench.json")], tmp), "## The block's fixed part")
    # ctx B weights_MB weights_us step-path block over goal met
    assert rows[0] == ["32K", "1", "400.0", "100.0", "115.0", "140.0", "1.15-1.40", "<= 1.1x", "no"], rows
    assert rows[1][4] == "95.0" and rows[1][6] == "0.95-1.40" and rows[1][8] == "between", rows


def test_projections_alone_against_their_goal(tmp):
    lin = [{"name": "block_linear B=%d in=%d out=%d accumulate=%d seed=1 impl=kernel/manual_time" % (B, i, o, a),
            "run_type": "iteration", "median_us": med, "goal_us": goal, "pct_of_ceiling": pct}
           for B, i, o, a, med, goal, pct in ((8, 4096, 4096, 1, 16.0, 8.0, 45.0), (1, 4096, 28672, 0, 55.0, 56.0, 92.0))]
    write(os.path.join(tmp, "bench.json"), [case("dense", 1, 32768, 180.0, 126.0)] + lin)
    rows = rows_after(report([os.path.join(tmp, "bench.json")], tmp), "## The block's projections alone")[1:]  # [0]: header
    # sorted by B, then the largest weights first
    assert rows[0] == ["1", "4096 x 28672", "234.9", "55.0", "92.0%", "0.98x", "yes"], rows
    assert rows[1] == ["8", "4096 x 4096 + residual", "33.6", "16.0", "45.0%", "2.00x", "no"], rows


def main():
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    passed = failed = 0
    for t in tests:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                t(tmp)
                passed += 1
                print("[       OK ] step_report: %s" % t.__name__)
            except Exception as e:  # a failed assertion or a script error: report, go on
                failed += 1
                print("[  FAILED  ] step_report: %s: %r" % (t.__name__, e))
    print("step_report: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
