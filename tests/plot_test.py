#!/usr/bin/env python3
"""Tests of harness/report/plot_report.py (and harness/report/plots.gp where gnuplot is installed; and
harness/report/publish.sh on a copy of the tree and its canonical round) on
tests/data/plot_fixture.json: round-42db883's bench1/bench2 trimmed to seven rows (decode_attn with
an in-suite impl and two external peers, one more decode_attn, selective_attn with an impl on its own
ceiling and a peer above 100%, index_scan without impl=, and gather_copy_d2d turned into a failed
case: its counters removed and an error_message added, as Google Benchmark writes SkipWithError).
Every expected value is computed here from the fixture, not typed in.
Prints one line "plot: N passed, N failed, N skipped" (tests/run_tests.sh sums it)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "data", "plot_fixture.json")


def find(name):
    """The source tree's harness/, or a bundle's top level (harness/scripts/make_bundle.sh)."""
    for p in (os.path.join(HERE, "..", "harness", "report", name), os.path.join(HERE, "..", name)):
        if os.path.exists(p):
            return p
    return os.path.join(HERE, "..", "harness", "report", name)


SCRIPT, GP = find("plot_report.py"), find("plots.gp")


class Skip(Exception):
    pass


def run(files, outdir):
    return subprocess.run([sys.executable, SCRIPT] + files + [outdir], capture_output=True, text=True)


def read_dat(outdir):
    """(comment lines, {label: [fields after the label]}, column names after 'suite')."""
    comments, rows, cols = [], {}, []
    with open(os.path.join(outdir, "plot.dat")) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("#"):
                comments.append(line)
                if "columns: label family ceiling run suite" in line:
                    cols = line.split("suite", 1)[1].split()
            elif line.strip():
                label, rest = line[1:].split('" ', 1)
                fields, quoted = [], False
                for w in rest.split(" "):  # the ceiling name is quoted and has spaces
                    if quoted:
                        fields[-1] += " " + w
                        quoted = not w.endswith('"')
                    else:
                        fields.append(w)
                        quoted = w.startswith('"') and not (len(w) > 1 and w.endswith('"'))
                rows[label] = [w.strip('"') for w in fields]
    return comments, rows, cols


def fixture():
    with open(FIXTURE) as f:
        return json.load(f)


def bench(doc, prefix, impl):
    for b in doc["benchmarks"]:
        if b["name"].startswith(prefix) and ("impl=%s/" % impl in b["name"] if impl else "impl=" not in b["name"]):
            return b
    raise KeyError(prefix)


def near(text, value):
    return abs(float(text) - value) < 0.006  # plot.dat has 2 decimals


def test_rows_values_and_peers(tmp):
    r = run([FIXTURE], tmp)
    assert r.returncode == 0, r.stderr
    comments, rows, cols = read_dat(tmp)
    assert sorted(rows) == ["decode_attn L=128K", "decode_attn L=32K", "index_scan", "selective_attn"], sorted(rows)
    doc = fixture()
    k = bench(doc, "decode_attn B=8 Hq=32 Hkv=8 D=128 L=32768 ", "kernel")
    s2 = bench(doc, "decode_attn B=8 Hq=32 Hkv=8 D=128 L=32768 ", "steps2")
    row = dict(zip(["family", "ceiling", "run", "suite"] + cols, rows["decode_attn L=32K"]))
    assert row["family"] == "decode_attn" and row["ceiling"] == "device read" and row["run"] == "plot_fixture", row
    assert near(row["suite"], k["pct_of_ceiling"]), row
    assert near(row["impl=steps2"], s2["pct_of_ceiling"]), row  # the in-suite pair
    for peer in ("torch_sdpa_cudnn", "torch_sdpa_flash"):  # external: the kernel's ceiling over the peer's time
        assert near(row[peer], 100.0 * k["ceiling_us"] / k["peer_us_" + peer]), (peer, row)
    assert row["impl=colsum_only"] == "NaN" and row["torch_sdpa_cudnn_fwd"] == "NaN", row
    # no impl= in the name: the case's only row is the suite's
    ix = dict(zip(["family", "ceiling", "run", "suite"] + cols, rows["index_scan"]))
    assert ix["ceiling"] == "device copy" and near(ix["suite"], bench(doc, "index_scan ", None)["pct_of_ceiling"]), ix


def test_own_ceiling_and_above_100_kept(tmp):
    assert run([FIXTURE], tmp).returncode == 0
    comments, rows, cols = read_dat(tmp)
    doc = fixture()
    k = bench(doc, "selective_attn ", "kernel")
    c = bench(doc, "selective_attn ", "colsum_only")
    row = dict(zip(["family", "ceiling", "run", "suite"] + cols, rows["selective_attn"]))
    assert near(row["impl=colsum_only"], c["pct_of_ceiling"]), row  # its own ceiling, not the kernel's
    assert any(l.startswith("# own ceiling differs") and "impl=colsum_only" in l for l in comments), comments
    over = 100.0 * k["ceiling_us"] / k["peer_us_torch_sdpa_cudnn_fwd"]
    assert over > 100 and near(row["torch_sdpa_cudnn_fwd"], over), row  # not clipped
    flagged = [l for l in comments if l.startswith("# ABOVE 100%")]
    assert len(flagged) == 1 and "torch_sdpa_cudnn_fwd" in flagged[0], flagged


def test_peer_at_its_own_rate_from_the_runs_peers_file(tmp):
    # the same fixture as a run's X_bench.json with an X_peers.json beside it: the cuDNN forward peer
    # gives its own TFLOPs, so it is stated as those over the run's GEMM rate, no longer above 100%
    doc = fixture()
    k = bench(doc, "selective_attn ", "kernel")
    keys = dict(w.split("=", 1) for w in k["name"].split("/", 1)[0].split()[1:] if "=" in w and not w.startswith("impl="))
    tflops = 0.5 * float(doc["context"]["ceiling_bf16_mma_TFLOPs"])
    bench_path, peers_path = os.path.join(tmp, "r1_bench.json"), os.path.join(tmp, "r1_peers.json")
    shutil.copy(FIXTURE, bench_path)
    with open(peers_path, "w") as f:
        json.dump({"peers": [{"kernel": "selective_attn", "match": {"L": int(keys["L"]), "D": int(keys["D"])},
                              "peer": "torch_sdpa_cudnn_fwd", "median_us": 1.0, "TFLOPs": tflops}]}, f)
    out = os.path.join(tmp, "out")
    assert run([bench_path], out).returncode == 0
    comments, rows, cols = read_dat(out)
    row = dict(zip(["family", "ceiling", "run", "suite"] + cols, rows["selective_attn"]))
    assert near(row["torch_sdpa_cudnn_fwd"], 50.0), row
    assert not [l for l in comments if l.startswith("# ABOVE 100%")], comments
    # the flash peer has no entry: on the kernel's work, and listed as such
    assert any("yardstick" in l and "torch_sdpa_flash_fwd" in l for l in comments), comments


def test_error_case_skipped_and_listed(tmp):
    assert run([FIXTURE], tmp).returncode == 0
    comments, rows, _ = read_dat(tmp)
    assert not any(l.startswith("gather_copy_d2d") for l in rows), rows
    listed = [l for l in comments if l.startswith("# skipped (error)")]
    assert len(listed) == 1 and "gather_copy_d2d" in listed[0] and "validation failed" in listed[0], listed


def test_no_usable_case_exits_nonzero(tmp):
    doc = fixture()
    doc["benchmarks"] = [b for b in doc["benchmarks"] if "error_message" in b]
    path = os.path.join(tmp, "errors_bench.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    r = run([path], os.path.join(tmp, "out"))
    assert r.returncode == 1 and "no usable case" in r.stderr and "gather_copy_d2d" in r.stderr, (r.returncode, r.stderr)


def test_newest_run_wins_whole_case(tmp):
    doc = fixture()
    newer = json.loads(json.dumps(doc))
    newer["context"]["date"] = "2099-01-01T00:00:00+00:00"
    newer["benchmarks"] = [b for b in newer["benchmarks"] if "L=32768" in b["name"] and "impl=kernel/" in b["name"]]
    newer["benchmarks"][0]["pct_of_ceiling"] = 50.0
    a, b = os.path.join(tmp, "new_bench.json"), os.path.join(tmp, "old_bench.json")
    with open(a, "w") as f:
        json.dump(newer, f)
    with open(b, "w") as f:
        json.dump(doc, f)
    r = run([a, b], os.path.join(tmp, "out"))  # the newer file first: the date decides, not the order
    assert r.returncode == 0, r.stderr
    comments, rows, cols = read_dat(os.path.join(tmp, "out"))
    row = dict(zip(["family", "ceiling", "run", "suite"] + cols, rows["decode_attn L=32K"]))
    assert row["run"] == "new" and row["suite"] == "50.00", row
    assert row.get("impl=steps2", "NaN") == "NaN", row  # the whole case from one run: old's steps2 is not mixed in
    assert any("superseded" in l and "new kept over old" in l for l in comments), comments


def test_gnuplot_draws_png(tmp):
    if not shutil.which("gnuplot"):
        raise Skip("no gnuplot")
    if not os.path.exists(GP):
        raise Skip("no plots.gp beside the script")
    assert run([FIXTURE], tmp).returncode == 0
    r = subprocess.run(["gnuplot", "-e", "datadir='%s'" % tmp, GP], capture_output=True, text=True)
    png = os.path.join(tmp, "pct_of_ceiling.png")
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_publish_replaces_only_the_rounds_files(tmp):
    """publish.sh on a copy of the tree: the round's files replace the old ones (a file the new round
    lacks goes), the directories beside them (A/B rounds, the main job's runs) stay, and the round's
    decode_step cases are tabulated in steps/."""
    src = os.path.normpath(os.path.join(HERE, ".."))
    publish = os.path.join(src, "harness", "report", "publish.sh")
    canonical = os.path.join(src, "results", "h200")
    if not os.path.exists(publish) or not os.path.exists(os.path.join(canonical, "bench.json")):
        raise Skip("not a source tree with a canonical round")
    if not shutil.which("gnuplot"):
        raise Skip("no gnuplot")
    root = os.path.join(tmp, "root")
    shutil.copytree(os.path.join(src, "harness", "report"), os.path.join(root, "harness", "report"))
    shutil.copy(os.path.join(src, "README.md"), root)
    os.makedirs(os.path.join(root, "results", "h200", "ab", "kept"))
    shutil.copy(os.path.join(src, "results", "README.md"), os.path.join(root, "results"))
    for family in os.listdir(os.path.join(src, "kernels")):
        note = os.path.join(src, "kernels", family, "NOTES.md")
        if os.path.exists(note):
            os.makedirs(os.path.join(root, "kernels", family))
            shutil.copy(note, os.path.join(root, "kernels", family))
    dest = os.path.join(root, "results", "h200")
    for name, text in (("ab/kept/a.json", "{}"), ("tests.log", "the old round's"), ("sanitize/old.log.gz", "")):
        os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
        with open(os.path.join(dest, name), "w") as f:
            f.write(text)
    rnd = os.path.join(tmp, "round")
    os.makedirs(rnd)
    for name in ("bench.json", "check.json", "device.txt", "round.log"):
        shutil.copy(os.path.join(canonical, name), rnd)
    r = subprocess.run(["bash", os.path.join(root, "harness", "report", "publish.sh"), rnd, "h200"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.exists(os.path.join(dest, "ab", "kept", "a.json")), "a directory beside the round was removed"
    assert not os.path.exists(os.path.join(dest, "tests.log")), "the old round's tests.log survived"
    assert not os.path.exists(os.path.join(dest, "sanitize")), "the old round's sanitize/ survived"
    with open(os.path.join(dest, "bench.json")) as a, open(os.path.join(rnd, "bench.json")) as b:
        assert a.read() == b.read()
    assert os.path.exists(os.path.join(dest, "pct_of_ceiling.png"))
    with open(os.path.join(dest, "steps", "tables.md")) as f: # the round's decode_step cases, tabulated
        assert "decode_step report" in f.read()


def main():
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    passed = failed = skipped = 0
    for t in tests:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                t(tmp)
                passed += 1
                print("[       OK ] plot: %s" % t.__name__)
            except Skip as e:
                skipped += 1
                print("[  SKIPPED ] plot: %s: %s" % (t.__name__, e))
            except Exception as e:  # a failed assertion or a script error: report, go on
                failed += 1
                print("[  FAILED  ] plot: %s: %r" % (t.__name__, e))
    print("plot: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
