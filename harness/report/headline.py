#!/usr/bin/env python3
"""headline.py: the README's headline table and each family note's "Current figures" block, generated
from one canonical round (never typed).

usage: python3 harness/report/headline.py RESULTS_DIR [--write] [--cases]

RESULTS_DIR holds the round's bench.json (Google Benchmark JSON with kvbench's counters, external
peers as peer_us_<name> counters) and summary.md (the goal text of each case). Without --write the
table is printed; with --write it replaces the text between the markers
    <!-- headline:begin --> ... <!-- headline:end -->           in README.md
    <!-- figures:begin FAMILY --> ... <!-- figures:end -->      in kernels/FAMILY/NOTES.md
--cases prints the case filters of the headline rows and of their in-suite peers, then ROUND_CASES (what
the round also benches: the cases of the paper-style step tables, harness/report/step_report.py, which
publish.sh writes to results/<gpu>/steps/, and the goal shapes of kernels whose goals hold at every bench
shape, a kernel named whole for its bench tier), one per line, for `kvbench bench`
(harness/scripts/gpu_round.sh reads them).

Every row names a case by its kernel and the keys that pick it out of the bench tier; its peer is an
in-suite implementation of the same shape (impl=NAME, timed in the same run) or an external peer
(peer:NAME, torch_peers.py, timed in the same round). A row whose case is missing from the round is
shown as "not measured", never filled in.
"""
import json
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# kernel -> family (the folder of its note, kernels/<family>/NOTES.md)
FAMILY = {
    "decode_attn": "decode", "sparse_attn_idx": "decode", "sparse_attn_pages": "decode",
    "topk": "select", "heavy_hitters": "heavy_hitters", "snapkv": "heavy_hitters",
    "page_meta_build": "page_scoring", "page_meta_append": "page_scoring", "hybrid_score": "page_scoring",
    "quest_score": "page_scoring", "omnikv_select": "omnikv", "index_scan": "gather_copy",
    "gather_copy": "gather_copy", "gather_copy_d2d": "gather_copy", "gather_copy_all": "gather_copy",
    "gather_step": "gather_copy", "packed_load": "gather_copy", "shadowkv_lowrank": "shadowkv",
    "shadowkv_landmarks": "shadowkv", "shadowkv_prefill": "shadowkv", "landmark_score": "landmark_score", "batch_gemm_rotary": "batch_gemm_rotary",
    "selective_attn": "selective_attn", "decode_step": "step", "rocketkv_decode": "step",
}
for k in ("int2_quantize", "int2_quantize_native", "int2_native", "int2_append", "int2_qk", "int2_av",
          "int2_qk_native", "int2_av_native", "int2_decode_attn"):
    FAMILY[k] = "int2"

# The headline rows: (label, case filter: the kernel then key=value tokens of its id, peer or None).
ROWS = [
    ("dense decode, B=8, 32K", "decode_attn B=8 Hq=32 Hkv=8 D=128 L=32768 len=0 vary=0 dist=normal seed=1 impl=kernel", "peer:torch_sdpa_cudnn"),
    ("dense decode, B=8, 128K", "decode_attn B=8 Hq=32 Hkv=8 D=128 L=131072 len=0 vary=0 dist=normal seed=1 impl=kernel", "peer:torch_sdpa_cudnn"),
    ("dense decode, B=1, 128K", "decode_attn B=1 Hq=32 Hkv=8 D=128 L=131072 len=0 vary=0 dist=normal seed=1 impl=kernel", "peer:torch_sdpa_cudnn"),
    ("dense decode, B=1, 32K", "decode_attn B=1 Hq=32 Hkv=8 D=128 L=32768 len=0 vary=0 dist=normal seed=1 impl=kernel", "peer:torch_sdpa_cudnn"),
    ("INT2 decode, B=8, 32K, gs=16", "int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=16 T=32768 R=64 dist=normal seed=1 impl=kernel", "impl=dense_bf16"),
    ("INT2 decode, B=8, 128K, gs=16", "int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=16 T=131072 R=64 dist=normal seed=1 impl=kernel", "impl=dense_bf16"),
    ("INT2 decode, B=8, 128K, gs=128", "int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=128 T=131072 R=64 dist=normal seed=1 impl=kernel", "impl=dense_bf16"),
    ("INT2 decode, B=1, 128K, gs=16", "int2_decode_attn B=1 Hq=32 Hkv=8 D=128 gs=16 T=131072 R=64 dist=normal seed=1 impl=kernel", "impl=dense_bf16"),
    ("selective attention forward, 16K", "selective_attn B=1 Hq=32 Hkv=32 L=16384 D=128 causal=1 w0=0 need_out=1 group_sum=0 input=normal sample=0 seed=1 impl=fwd_only", "peer:torch_sdpa_cudnn_fwd"),
    ("selective attention O+LSE+colsum, 16K", "selective_attn B=1 Hq=32 Hkv=32 L=16384 D=128 causal=1 w0=0 need_out=1 group_sum=0 input=normal sample=0 seed=1 impl=kernel", "peer:torch_sdpa_cudnn_fwd"),
    ("selective attention O+LSE+colsum, 32K", "selective_attn B=1 Hq=32 Hkv=32 L=32768 D=128 causal=1 w0=0 need_out=1 group_sum=0 input=normal sample=0 seed=1 impl=kernel", "peer:torch_sdpa_cudnn_fwd"),
    ("heavy hitters, 32K", "heavy_hitters B=1 Hq=32 Hkv=8 L=32768 D=128 heavy=0.25 recent=0.25 layer=0 layers=1 select_per=kv seed=1", None),
    ("SnapKV, 128K", "snapkv B=1 Hq=32 Hkv=8 L=131072 D=128 budget=4096 ks=0 input=normal seed=1", None),
    ("top-k, 256 rows of 128K, k=4096", "topk rows=256 n=131072 k=4096 dist=normal seed=1 impl=kernel", "peer:torch_topk"),
    ("top-k, 1 row of 128K, k=2048", "topk rows=1 n=131072 k=2048 dist=normal seed=1 impl=kernel", "peer:torch_topk"),
    ("top-k, 1 row of 2M, k=8192", "topk rows=1 n=2097152 k=8192 dist=normal seed=1 impl=kernel", "peer:torch_topk"),
    ("hybrid page scoring, B=8, 128K", "hybrid_score B=8 Hq=32 Hkv=8 D=128 L=131072 budget=2048 Lmax=0 P=0 r=0 k=0 cap=0 input=outlier seed=1 impl=kernel", "impl=score_only"),
    ("hybrid page scoring, B=1, 128K", "hybrid_score B=1 Hq=32 Hkv=8 D=128 L=131072 budget=2048 Lmax=0 P=0 r=0 k=0 cap=0 input=outlier seed=1 impl=kernel", "impl=score_only"),
    ("Quest page scoring, B=8, 128K", "quest_score B=8 Hq=32 Hkv=8 D=128 L=131072 P=16 budget=2048 cap=0 input=outlier seed=1 impl=kernel", "impl=score_only"),
    ("OmniKV selection, B=8, 128K", "omnikv_select B=8 Hq=32 Hkv=8 D=128 L=131072 len=0 vary=0 k=2048 dist=normal seed=1 impl=kernel", None),
    ("gather from pinned host, B=8", "gather_copy_all B=8 Hkv=8 M=256 c=8 D=128 ctx=131072 host_stride=0 sparse_start=416 extra=64 seed=1 impl=kernel", "impl=memcpy_chunks"),
    ("ShadowKV fetch step, B=8, hit 0.6", "gather_step B=8 Hkv=8 M=256 c=8 D=128 ctx=131072 sparse_start=416 extra=64 hit=0.6 empty=0 seed=1", None),
    ("OmniKV packed load, 8 layers", "packed_load B=1 layers=8 T=131072 k=2048 Hkv=8 D=128 seed=1 impl=kernel", "impl=memcpy_rows"),
    ("ShadowKV landmark scoring, B=48", "landmark_score B=48 Hq=32 Hkv=8 D=128 Lm=7628 M=256 outliers=48 dist=normal seed=1 impl=kernel", "impl=cublas_composed"),
    ("ShadowKV key rebuild + RoPE, B=48", "batch_gemm_rotary B=48 Hkv=8 D=128 r=160 c=8 M=256 ctx=61440 hit=0 rope=llama theta=500000 sparse_start=416 extra=64 seed=1 impl=kernel", "impl=cublas_composed"),
    ("ShadowKV prefill SVD, 32K x 1024", "shadowkv_lowrank S=32768 Hkv=8 D=128 r=160 dist=normal seed=1 impl=kernel", "peer:torch_svd_lowrank"),
    ("ShadowKV prefill of one layer, 32K", "shadowkv_prefill S=32768 Hkv=8 D=128 r=160 c=8 local_chunks=4 outlier_chunks=48 dist=normal seed=1 impl=kernel", None),
    ("RocketKV decode, B=8, 128K", "rocketkv_decode B=8 Hq=32 Hkv=8 D=128 Lmax=131072 T=2048 M=50 gen=0 P=0 r=0 k=0 all=0 seed=1 impl=kernel", "impl=dense"),
    ("RocketKV decode, B=1, 128K", "rocketkv_decode B=1 Hq=32 Hkv=8 D=128 Lmax=131072 T=2048 M=50 gen=0 P=0 r=0 k=0 all=0 seed=1 impl=kernel", "impl=dense"),
    ("sparse attention, token list, B=8, 32K, 2048", "sparse_attn_idx B=8 Hq=32 Hkv=8 D=128 L=32768 len=0 vary=0 budget=2048 dist=normal seed=1 impl=kernel", None),
    ("sparse attention, token list, B=1, 128K, 2048", "sparse_attn_idx B=1 Hq=32 Hkv=8 D=128 L=131072 len=0 vary=0 budget=2048 dist=normal seed=1 impl=kernel", None),
    ("sparse attention, pages, B=8, 128K, 2048", "sparse_attn_pages B=8 Hq=32 Hkv=8 D=128 L=131072 len=0 vary=0 budget=2048 dist=normal seed=1 P=16 impl=kernel", None),
    ("decode step, dense, B=1, 32K", "decode_step method=dense role=sparse model=llama3-8b B=1 ctx=32768 gen=0 budget=2048 all=0 rank=160 hit=0.6 seed=1 impl=kernel", "peer:torch_block_cudnn_graph"),
    ("decode step, MiniKV, B=1, 32K", "decode_step method=minikv role=sparse model=llama3-8b B=1 ctx=32768 gen=0 budget=2048 all=0 rank=160 hit=0.6 seed=1 impl=kernel", None),
    ("decode step, RocketKV, B=1, 32K", "decode_step method=rocketkv role=sparse model=llama3-8b B=1 ctx=32768 gen=0 budget=2048 all=0 rank=160 hit=0.6 seed=1 impl=kernel", None),
    ("decode step, OmniKV sparse layer, B=1, 32K", "decode_step method=omnikv role=sparse model=llama3-8b B=1 ctx=32768 gen=0 budget=2048 all=0 rank=160 hit=0.6 seed=1 impl=kernel", None),
    ("decode step, ShadowKV, B=1, 60K", "decode_step method=shadowkv role=sparse model=llama3-8b B=1 ctx=61440 gen=0 budget=1024 all=0 rank=160 hit=0.6 seed=1 impl=kernel", None),
]

# Benched by the round beside the headline rows, not shown in it: ShadowKV at the paper's batches and dense
# at its largest batch at the same contexts (ShadowKV's Table 3; step_report.py pairs them by run), and the
# decode steps at the block's goal shapes (step_report.py's tables against the bound, dense and PyTorch).
STEP = "decode_step role=sparse model=llama3-8b gen=0 all=0 rank=160 hit=0.6 seed=1 impl=kernel"
ROUND_CASES = [
    STEP.replace("decode_step", "decode_step method=shadowkv B=48 ctx=61440 budget=1024"),
    STEP.replace("decode_step", "decode_step method=shadowkv B=24 ctx=124928 budget=2048"),
    STEP.replace("decode_step", "decode_step method=shadowkv B=12 ctx=249856 budget=4096"),
    STEP.replace("decode_step", "decode_step method=dense B=16 ctx=61440 budget=2048"),
    STEP.replace("decode_step", "decode_step method=dense B=8 ctx=124928 budget=2048"),
    STEP.replace("decode_step", "decode_step method=dense B=4 ctx=249856 budget=2048"),
] + [
    # the block's goal shapes (B=1 and 8 at 32K and 128K; B=1 32K is a headline row): dense, MiniKV and
    # OmniKV's two roles, which with dense compose OmniKV's model step, and RocketKV at 128K
    STEP.replace("decode_step", f"decode_step method={method} B={b} ctx={ctx} budget=2048").replace("role=sparse", f"role={role}")
    for method, role in (("dense", "sparse"), ("minikv", "sparse"), ("omnikv", "filter"), ("omnikv", "sparse"), ("rocketkv", "sparse"))
    for b, ctx in ((1, 32768), (1, 131072), (8, 32768), (8, 131072))
    if (b, ctx) != (1, 32768) or role == "filter"
] + [
    # the block's four projections alone at B = 1, 8, 16, 48 (the bench tier's block_linear cases): the
    # step report's table of each against its 90%-of-read goal
    "block_linear",
] + [
    # every bench shape of the selection path's kernels, whose goals hold at each of them (the top-k's
    # 3 reads + 10 us, the sparse attention's read rate at every budget, the scorings with their page
    # top-k, RocketKV's decode against dense), and the INT2 quantizer's 70% of the copy rate
    "topk", "sparse_attn_idx", "sparse_attn_pages", "hybrid_score", "quest_score", "rocketkv_decode",
    "int2_quantize",
] + [
    # the prefill factorization's in-suite peers at its goal shape: the exact Gram + syevdx path and
    # cuSOLVER's randomized SVD (kernels/shadowkv/NOTES.md)
    "shadowkv_lowrank S=32768 Hkv=8 D=128 r=160 dist=normal seed=1 impl=" + impl for impl in ("syevdx", "gesvdr")
]

# op.h kvb_ceiling_kind, in enum order
CEILING = ["", "pinned H2D copy", "device copy", "bf16 matrix rate", "device read", "read + H2D"]


def case_id(name):
    """A Google Benchmark entry's name is the case id, then '/manual_time' and perhaps more."""
    return name.split("/")[0]


def tokens(s):
    return s.split()


def matches(cid, filt):
    t, f = tokens(cid), tokens(filt)
    return t[0] == f[0] and all(x in t[1:] for x in f[1:])


def with_impl(filt, impl):
    t = [x for x in tokens(filt) if not x.startswith("impl=")]
    return " ".join(t + ["impl=" + impl])


def load(results):
    with open(os.path.join(results, "bench.json")) as f:
        bench = json.load(f)
    cases = {}
    for b in bench.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration" or "median_us" not in b:
            continue
        cases[case_id(b["name"])] = b
    goals = {}
    path = os.path.join(results, "summary.md")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                m = re.match(r"\| `([^`]+)` \|", line)
                if m and m.group(1) not in goals:  # the first table (later ones: clocks per case)
                    cells = [c.strip() for c in line.strip().strip("|").split("|")]
                    g = re.search(r"\(([^()]*)\)\s*$", cells[-1]) if cells else None
                    goals[m.group(1)] = g.group(1) if g else ""
    # peers a round's publisher moved out of its figures (peers_excluded.json: why, and their values)
    excluded = set()
    path = os.path.join(results, "peers_excluded.json")
    if os.path.exists(path):
        with open(path) as f:
            excluded = {(p["kernel"], p["peer"]) for p in json.load(f).get("peers", [])}
    return bench.get("context", {}), cases, goals, excluded


def find(cases, filt):
    hit = [cid for cid in cases if matches(cid, filt)]
    return (hit[0], cases[hit[0]]) if len(hit) == 1 else (None, None)


def fmt_us(us):
    return "%.1f us" % us if us < 1000 else "%.2f ms" % (us / 1000)


def row_cells(label, filt, peer, cases, goals, excluded=frozenset()):
    cid, b = find(cases, filt)
    if not b:
        return [label, "not measured", "", "", ""]
    med = b["median_us"]
    pct = ""
    if b.get("pct_of_ceiling"):
        kind = int(b.get("ceiling_kind", 0))
        pct = "%.1f%% of %s" % (b["pct_of_ceiling"], CEILING[kind] if 0 <= kind < len(CEILING) else "ceiling")
    ratio = ""
    name, peer_us = None, None
    if peer and peer.startswith("impl="):
        name = "impl=" + peer[5:]
        pb = find(cases, with_impl(filt, peer[5:]))[1]
        peer_us = pb["median_us"] if pb else None
    elif peer and peer.startswith("peer:"):
        name = peer[5:]
        peer_us = b.get("peer_us_" + name)
    if peer_us:
        x = peer_us / med
        ratio = "%s %s than %s (%s)" % (times(x if x >= 1 else 1 / x), "faster" if x >= 1 else "slower", name, fmt_us(peer_us))
    elif name and (cid.split()[0], name) in excluded:
        ratio = "%s excluded from this round (peers_excluded.json)" % name
    elif name:
        ratio = "%s not measured" % name
    goal = ""
    if b.get("goal_us"):
        r = med / b["goal_us"]
        text = goals.get(cid, "")
        goal = "%s: **%s** (%s of %s)" % (text or "goal", "met" if r <= 1.0 else "missed", times(r), fmt_us(b["goal_us"]))
    flag = " (clocks fell)" if b.get("clock_flagged") else ""
    return [label, fmt_us(med) + flag, pct, ratio, goal]


def times(x):
    """x as a ratio: two decimals, three where two would round a miss or a win to 1.00x"""
    return "%.3fx" % x if 0.995 <= x < 1.005 and x != 1.0 else "%.2fx" % x


def table(rows, cases, goals, excluded=frozenset()):
    out = ["| kernel and shape | median | % of ceiling | same-run peer | goal |", "|---|---:|---:|---|---|"]
    flagged = False
    for label, filt, peer in rows:
        cells = row_cells(label, filt, peer, cases, goals, excluded)
        flagged |= cells[1].endswith("(clocks fell)")
        out.append("| " + " | ".join(cells) + " |")
    if flagged:
        out += ["", "(clocks fell): the SM clock fell during the case's timing loop (NVML; the reasons, e.g. a "
                "power cap, are in summary.md's clocks per case)."]
    return out


def family_rows(family, cases):
    """The family's rows: its headline rows, then every other case of its kernels in the round."""
    rows = [r for r in ROWS if FAMILY.get(tokens(r[1])[0]) == family]
    seen = {find(cases, r[1])[0] for r in rows}
    seen |= {find(cases, with_impl(r[1], r[2][5:]))[0] for r in rows if r[2] and r[2].startswith("impl=")}
    for cid in sorted(cases):
        if FAMILY.get(tokens(cid)[0]) == family and cid not in seen:
            rows.append(("`%s`" % cid, cid, None))
    return rows


def device_line(ctx, results):
    gpu = ctx.get("gpu", "unknown GPU")
    rev = ctx.get("kvbench_git_revision", "?")
    date = ctx.get("date", "?")[:10]
    return "%s, driver %s, kvbench %s, %s (`%s/bench.json`)" % (gpu, ctx.get("gpu_driver", "?"), rev, date,
                                                               os.path.relpath(results, ROOT))


def replace_block(path, begin, end, body):
    with open(path) as f:
        text = f.read()
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        sys.exit("headline: %s has no %s ... %s block" % (path, begin, end))
    new = text[: i + len(begin)] + "\n" + body + "\n" + text[j:]
    if new != text:
        with open(path, "w") as f:
            f.write(new)
        print("headline: wrote %s" % os.path.relpath(path, ROOT))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit(__doc__)
    results = os.path.abspath(args[0])
    if "--cases" in sys.argv:
        # a kernel named whole in ROUND_CASES brings its bench tier, which holds its headline cases
        whole = {f for f in ROUND_CASES if " " not in f}
        for _, filt, peer in ROWS:
            if filt.split()[0] in whole:
                continue
            print(filt)
            if peer and peer.startswith("impl="):
                print(with_impl(filt, peer[5:]))
        for filt in ROUND_CASES:
            print(filt)
        return
    ctx, cases, goals, excluded = load(results)
    head = table(ROWS, cases, goals, excluded)
    body = "\n".join(["Measured on " + device_line(ctx, results) + ".", ""] + head)
    if "--write" not in sys.argv:
        print(body)
        return
    replace_block(os.path.join(ROOT, "README.md"), "<!-- headline:begin -->", "<!-- headline:end -->", body)
    for family in sorted(set(FAMILY.values())):
        note = os.path.join(ROOT, "kernels", family, "NOTES.md")
        if not os.path.exists(note):
            print("headline: %s has no note" % family)
            continue
        rows = family_rows(family, cases)
        block = ["Measured on " + device_line(ctx, results) + "; generated by `make headline`.", ""]
        block += table(rows, cases, goals, excluded) if rows else ["No case of this family in the canonical round."]
        replace_block(note, "<!-- figures:begin %s -->" % family, "<!-- figures:end -->", "\n".join(block))


if __name__ == "__main__":
    main()
