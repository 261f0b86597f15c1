#!/usr/bin/env python3
"""decode_step report: paper-style tables and a stage-breakdown data file from one bench JSON.

usage: python3 harness/report/step_report.py BENCH_JSON [BENCH_JSON ...] OUTDIR

Writes OUTDIR/tables.md (per method: step time against the bound and against dense, as in
ShadowKV's Table 3; a per-stage latency breakdown, as in its Table 13; ShadowKV's throughput at the
paper's batch against dense's at its largest; OmniKV's model step composed from its layer roles;
dense against the PyTorch peers) and OUTDIR/stages.dat (stage groups per case, for
harness/report/step_stages.gp).
Several files: each is a run, named by its file name up to the first '_' (b_bench.json: run b;
a_filter_bench.json and a_dense_bench.json: both run a, one call on one machine). A method is set
beside dense only within its run, so every ratio comes from one run.
Why a script and not the C summary: these tables join cases (a method against dense at the same
ctx and B), which the per-case summary cannot. Every number printed comes from the JSON.
Stdlib only, so it runs wherever the results are copied.
"""
import json
import os
import re
import sys

OP = "decode_step"
# The block's stages outside attention; any other stage is the method's attention path. o_weights_to_l2
# (o_proj's weights read into L2 on the side stream beside a path that asks for it) is the block's.
PRE_STAGES = ["rmsnorm1", "qkv_proj", "rope", "o_weights_to_l2"]
POST_STAGES = ["o_proj", "rmsnorm2", "gate_up_proj", "silu_mul", "down_proj"]
# stages.dat groups, in column order; "attention" takes whatever no other group names.
GROUPS = [
    ("norms", ["rmsnorm1", "rmsnorm2"]),
    ("projections", ["qkv_proj", "o_weights_to_l2", "o_proj", "gate_up_proj", "down_proj"]),
    ("rope+silu", ["rope", "silu_mul"]),
    ("attention", None),
]
# Name keys that describe the workload (not a method's knob): a method's case is compared with
# the dense case that agrees on these.
WORKLOAD_KEYS = ["model", "B", "ctx", "gen"]
LAYERS = 32  # tokens/s projection when the JSON lacks tokens_per_s: a Llama-3-8B has 32 blocks
# OmniKV's layer roles in a 32-layer model (kernels/step/NOTES.md; reference/omnikv.h): used when a case lacks the
# role_layers / dense_layers counters the bench reports.
OMNIKV_LAYERS = {"dense": 5, "filter": 3, "sparse": 24}
OMNIKV_GOAL_CTX = 131072  # the goal (kernels/step/NOTES.md): at 128K, >= 1.7x where the bound ratio allows (B >= 2), else 90% of it
STAGE_PREFIX = "stage_us_"
# A stage run once per chunk of the batch ("landmark_score_c0", "landmark_score_c1", ...).
CHUNK_STAGE = re.compile(r"^(.*)_c[0-9]+$")
PEER_PREFIX = "peer_us_torch_block_"


# ---- reading ----

def parse_name(name):
    """'decode_step k=v ... impl=kernel/manual_time' -> (op, {k: v}); the '/...' suffix is dropped."""
    words = name.split()
    params = {}
    for w in words[1:]:
        k, _, v = w.partition("=")
        params[k] = v.split("/", 1)[0]
    return words[0] if words else "", params


def is_aggregate(b):
    # Google Benchmark marks repetition aggregates (mean, median, stddev, cv) both ways
    return b.get("run_type") == "aggregate" or "aggregate_name" in b


def label_stage_order(b):
    """Stage names in run order from the label's 'stages: a 1.0 us, b 2.0 us' (JSON keys are sorted)."""
    label = b.get("label", "")
    at = label.rfind("stages: ")
    if at < 0:
        return None
    text = label[at + len("stages: "):].split(";")[0]
    names = [m.group(1) for m in re.finditer(r"(\S+) -?[0-9.]+(?:e[-+]?\d+)? us", text)]
    return names or None


def canonical_order(b):
    """Fallback when no label lists the stages: the block's fixed order around the attention stages."""
    keys = [k[len(STAGE_PREFIX):] for k in b if k.startswith(STAGE_PREFIX)]
    attn = [k for k in keys if k not in PRE_STAGES + POST_STAGES]
    return [s for s in PRE_STAGES if s in keys] + attn + [s for s in POST_STAGES if s in keys]


def run_name(path):
    base = os.path.basename(path)
    return base.split("_", 1)[0] if "_" in base else base


def fold_chunks(order, stages):
    """A stage run once per chunk of the batch is one column, the sum of its chunks' device times."""
    folded = {}
    for s in order:
        m = CHUNK_STAGE.match(s)
        base = m.group(1) if m else s
        folded[base] = folded.get(base, 0.0) + stages[s]
    return list(folded), folded


def load_cases(doc, run=""):
    """A bench file's decode_step cases (doc: its parsed JSON)."""
    cases = []
    for b in doc.get("benchmarks", []):
        if not b.get("name", "").startswith(OP + " ") or is_aggregate(b):
            continue
        _, params = parse_name(b["name"])
        order = label_stage_order(b)
        stage_src = "label"
        if order is None:
            order, stage_src = canonical_order(b), "canonical"
        # a label may miss a stage the JSON has (or name one it lacks): the JSON decides what exists
        present = {k[len(STAGE_PREFIX):] for k in b if k.startswith(STAGE_PREFIX)}
        order = [s for s in order if s in present] + [s for s in canonical_order(b) if s not in order]
        order, stages = fold_chunks(order, {s: b[STAGE_PREFIX + s] for s in order})
        cases.append({
            "run": run,
            "h2d_GBps": float(doc.get("context", {}).get("ceiling_h2d_memcpy_GBps") or 0) or None,
            "b": b,
            "params": params,
            "method": params.get("method", "?"),
            "impl": params.get("impl", "?"),
            "order": order,
            "stage_src": stage_src,
            "stages": stages,
        })
    return doc.get("context", {}), cases


def load_linear(doc, run=""):
    """The block's projections benched alone (block_linear cases) in a bench file."""
    return [{"run": run, "b": b, "params": parse_name(b["name"])[1]} for b in doc.get("benchmarks", [])
            if b.get("name", "").startswith("block_linear ") and not is_aggregate(b)]


def device_name(ctx):
    for k in ("gpu", "device", "gpu_name", "device_name"):
        if ctx.get(k):
            return str(ctx[k])
    return "unknown device"


# ---- derived values ----

def tokens_per_s(b):
    if "tokens_per_s" in b:
        return b["tokens_per_s"]
    # the same projection the bench makes: B tokens per step of LAYERS blocks
    return int(parse_name(b["name"])[1].get("B", 1)) / (b["median_us"] * 1e-6 * LAYERS)


def merge_orders(orders):
    """Union of ordered stage lists: a stage new to the union goes right after its predecessor."""
    out = []
    for order in orders:
        prev = None
        for s in order:
            if s not in out:
                out.insert(out.index(prev) + 1 if prev is not None else 0, s)
            prev = s
    return out


def ctx_k(ctx):
    n = int(ctx)
    return "%dK" % (n // 1024) if n % 1024 == 0 else str(n)


def row_key(c):
    """Sort key: ctx, B, budget, then the rest, numerically where the value is a number."""
    def num(v):
        try:
            return (0, float(v), "")
        except ValueError:
            return (1, 0.0, v)
    p = c["params"]
    first = ["ctx", "B", "budget"]
    rest = [k for k in sorted(p) if k not in first + ["method", "impl"]]  # callers group by these
    return [num(p.get(k, "")) for k in first] + [num(p[k]) for k in rest]


def method_columns(cases, method):
    """Name keys shown as columns: ctx and B always; budget for rocketkv or when it varies; any other
    key that varies (so that rows stay distinct); the constant rest goes in the heading."""
    keys = []
    for c in cases:
        keys += [k for k in c["params"] if k not in keys and k not in ("method", "impl")]
    varies = {k for k in keys if len({c["params"].get(k) for c in cases}) > 1}
    cols = ["ctx", "B"]
    if "budget" in keys and (method == "rocketkv" or "budget" in varies):
        cols.append("budget")
    cols += [k for k in keys if k in varies and k not in cols]
    const = [(k, cases[0]["params"][k]) for k in keys if k not in cols and k not in varies]
    return cols, const


# ---- formatting ----

def us(x):
    return "%.1f" % x if x is not None else "–"


def ratio(x):
    return "%.2f" % x if x is not None else "–"


def md_table(headers, rows):
    """Markdown table, right-aligned: nearly every cell is a number."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def param_cell(k, v):
    return ctx_k(v) if k == "ctx" else v


# ---- the tables ----

def methods_in_order(cases):
    out = []
    for c in cases:
        if c["method"] not in out:
            out.append(c["method"])
    return out


def find_dense(cases, c):
    wl = [c["params"].get(k) for k in WORKLOAD_KEYS]
    for d in cases:
        if (d["method"] == "dense" and d["impl"] == c["impl"] and d["run"] == c["run"]
                and [d["params"].get(k) for k in WORKLOAD_KEYS] == wl):
            return d
    return None


def multi_run(cases):
    return len({c["run"] for c in cases}) > 1


def step_table(all_cases, mcases, method):
    """Table-3-like: step time against its bound, throughput, state, and (not dense) against dense."""
    cols, _ = method_columns(mcases, method)
    runs = multi_run(all_cases)
    headers = (["run"] if runs else []) + cols + ["step us", "bound us", "time / bound", "tokens/s (32 layers)",
                      "state/seq MiB (1 layer)", "max batch on device"]
    vs_dense = method != "dense"
    if vs_dense:
        headers += ["dense step us", "speedup vs dense", "bound ratio (dense/this)", "speedup % of bound ratio"]
    rows = []
    for c in mcases:
        b = c["b"]
        med, ceil = b.get("median_us"), b.get("ceiling_us")
        row = ([c["run"]] if runs else []) + [param_cell(k, c["params"].get(k, "")) for k in cols]
        row += [us(med), us(ceil), ratio(med / ceil if med and ceil else None), us(tokens_per_s(b)),
                us(b["state_bytes_per_seq"] / 2**20 if "state_bytes_per_seq" in b else None),
                "%d" % b["max_batch_device"] if "max_batch_device" in b else "–"]
        if vs_dense:
            d = find_dense(all_cases, c)
            dmed = d["b"].get("median_us") if d else None
            dceil = d["b"].get("ceiling_us") if d else None
            speedup = dmed / med if dmed and med else None
            bound_ratio = dceil / ceil if dceil and ceil else None
            row += [us(dmed), ratio(speedup), ratio(bound_ratio),
                    "%.1f%%" % (100 * speedup / bound_ratio) if speedup and bound_ratio else "–"]
        rows.append(row)
    return md_table(headers, rows)


def breakdown_table(mcases, method):
    """Table-13-like: per-stage device time of each case, stages in run order."""
    cols, _ = method_columns(mcases, method)
    stages = merge_orders(c["order"] for c in mcases)
    runs = multi_run(mcases)
    headers = (["run"] if runs else []) + cols + [s.replace("|", "/") for s in stages] + ["sum of stages", "step us"]
    rows = []
    for c in mcases:
        row = ([c["run"]] if runs else []) + [param_cell(k, c["params"].get(k, "")) for k in cols]
        row += [us(c["stages"].get(s)) for s in stages]
        row += [us(sum(c["stages"].values()) if c["stages"] else None), us(c["b"].get("median_us"))]
        rows.append(row)
    return md_table(headers, rows)


def peer_table(dense_cases):
    """Dense step against the PyTorch block peers of the same run; peer/suite > 1: the suite is faster."""
    peers = sorted({k[len(PEER_PREFIX):] for c in dense_cases for k in c["b"] if k.startswith(PEER_PREFIX)})
    runs = multi_run(dense_cases)
    headers = (["run"] if runs else []) + ["ctx", "B", "impl", "suite step us"]
    for p in peers:
        headers += [p + " us", p + " / suite"]
    rows = []
    for c in dense_cases:
        b, p = c["b"], c["params"]
        row = ([c["run"]] if runs else []) + [ctx_k(p.get("ctx", "")), p.get("B", ""), c["impl"], us(b.get("median_us"))]
        for name in peers:
            v = b.get(PEER_PREFIX + name)
            row += [us(v), ratio(v / b["median_us"] if v is not None and b.get("median_us") else None)]
        rows.append(row)
    return md_table(headers, rows)


def fixed_part_rows(cases, ctx):
    """The block without its attention path against reading its weights once (goal <= 1.1x), from the
    dense steps (impl=kernel): the block's stages as stage-timed (each with its own timing gap: an upper
    estimate) and the step timed whole minus its attention path's stages (a lower one), against the
    block's weights at the run's read ceiling. Per-block weights: model_weight_bytes over the layers the
    throughput projects to."""
    read = float(ctx.get("ceiling_read_GBps") or 0)
    rows = []
    for c in sorted((c for c in cases if c["method"] == "dense" and c["impl"] == "kernel"), key=row_key):
        b, st = c["b"], c["stages"]
        med, tps, wbytes = b.get("median_us"), b.get("tokens_per_s"), b.get("model_weight_bytes")
        if not (read and med and tps and wbytes and st):
            continue
        layers = int(c["params"].get("B", 1)) / (tps * med * 1e-6)
        w_us = wbytes / layers / (read * 1e9) * 1e6
        block = sum(v for k, v in st.items() if k in PRE_STAGES + POST_STAGES)
        path = sum(v for k, v in st.items() if k not in PRE_STAGES + POST_STAGES)
        low, high = (med - path) / w_us, block / w_us
        met = "yes" if high <= 1.1 else "no" if low > 1.1 else "between"
        rows.append([ctx_k(c["params"].get("ctx", "")), c["params"].get("B", ""), "%.1f" % (wbytes / layers / 1e6),
                     us(w_us), us(med - path), us(block), "%.2f-%.2f" % (low, high), "<= 1.1x", met])
    return rows


def linear_rows(linear):
    """Each projection alone (block_linear, its goal the bench's: 90% of the read rate)."""
    def key(c):
        p = c["params"]
        return (c["run"], int(p.get("B", 0)), -int(p.get("out", 0)) * int(p.get("in", 0)))
    rows = []
    for c in sorted(linear, key=key):
        b, p = c["b"], c["params"]
        med, goal = b.get("median_us"), b.get("goal_us")
        wmb = int(p.get("in", 0)) * int(p.get("out", 0)) * 2 / 1e6
        rows.append(([c["run"]] if c["run"] else []) + [
            p.get("B", ""), "%s x %s%s" % (p.get("in", ""), p.get("out", ""), " + residual" if p.get("accumulate") == "1" else ""),
            "%.1f" % wmb, us(med), "%.1f%%" % b["pct_of_ceiling"] if "pct_of_ceiling" in b else "–",
            "%.2fx" % (med / goal) if med and goal else "–",
            ("yes" if med <= goal else "no") if med and goal else "–"])
    return rows


def omnikv_rows(cases):
    """OmniKV's model step from one block per role: for each (model, B, ctx, gen, budget) with a filter
    and a sparse case and the dense case of the same workload (impl=kernel), t_omnikv = n_dense t_dense +
    n_filter t_filter + n_sparse t_sparse against the dense model's (n_dense + n_filter + n_sparse) t_dense;
    the bounds composed the same way. Returns (composed rows, per-role rows)."""
    key_names = WORKLOAD_KEYS + ["budget"]
    groups = {}
    for c in cases:
        if c["method"] == "omnikv" and c["impl"] == "kernel":
            key = tuple(c["params"].get(k) for k in key_names) + (c["run"],)
            groups.setdefault(key, {})[c["params"].get("role", "sparse")] = c
    composed, per_role = [], []
    def order(key):  # ctx, B, budget, as the other tables; then the rest
        p = dict(zip(key_names, key))
        return [float(p[k]) if p[k] and p[k].replace(".", "", 1).isdigit() else 0.0 for k in ("ctx", "B", "budget", "gen")] + [p["model"] or "", key[-1]]
    for key in sorted(groups, key=order):
        roles = groups[key]
        d = find_dense(cases, next(iter(roles.values())))
        p = dict(zip(key_names, key))
        run = [key[-1]] if multi_run(cases) else []
        for role in ("filter", "sparse"):
            if role not in roles:
                continue
            b = roles[role]["b"]
            n = int(b.get("role_layers", OMNIKV_LAYERS[role]))
            dmed = d["b"].get("median_us") if d else None
            per_role.append(run + [ctx_k(p["ctx"]), p["B"], p["budget"], role, n, us(b.get("median_us")),
                             us(b.get("ceiling_us")), us(dmed),
                             ratio(dmed / b["median_us"] if dmed and b.get("median_us") else None)])
        if d is None or "filter" not in roles or "sparse" not in roles:
            continue
        f, sp, db = roles["filter"]["b"], roles["sparse"]["b"], d["b"]
        n_dense = int(f.get("dense_layers", sp.get("dense_layers", OMNIKV_LAYERS["dense"])))
        n_filter = int(f.get("role_layers", OMNIKV_LAYERS["filter"]))
        n_sparse = int(sp.get("role_layers", OMNIKV_LAYERS["sparse"]))
        n_all = n_dense + n_filter + n_sparse

        def compose(field):
            vals = [db.get(field), f.get(field), sp.get(field)]
            if any(v is None for v in vals):
                return None, None
            return n_dense * vals[0] + n_filter * vals[1] + n_sparse * vals[2], n_all * vals[0]
        t_omni, t_dense = compose("median_us")
        b_omni, b_dense = compose("ceiling_us")
        speedup = t_dense / t_omni if t_omni else None
        bound_ratio = b_dense / b_omni if b_omni else None
        goal, met = "–", "–"
        if int(p["ctx"]) == OMNIKV_GOAL_CTX and speedup and bound_ratio:
            if int(p["B"]) >= 2 and bound_ratio >= 1.7:
                goal, met = ">= 1.7x", "yes" if speedup >= 1.7 else "no"
            else:
                goal, met = ">= 90% of bound ratio", "yes" if speedup >= 0.9 * bound_ratio else "no"
        B = int(p["B"])
        composed.append(run + [ctx_k(p["ctx"]), p["B"], p["budget"], "%d+%d+%d" % (n_dense, n_filter, n_sparse),
                         us(t_omni), us(t_dense), ratio(speedup), us(b_omni), us(b_dense), ratio(bound_ratio),
                         "%.1f%%" % (100 * speedup / bound_ratio) if speedup and bound_ratio else "–",
                         us(B / (t_omni * 1e-6)) if t_omni else "–", us(B / (t_dense * 1e-6)) if t_dense else "–",
                         goal, met])
    return composed, per_role


def shadowkv_rows(cases):
    """ShadowKV at each batch above 1 against the dense case of its run, model, ctx and gen whose B is
    dense's max_batch_device (impl=kernel): throughput ratio and bound ratio. No such dense case in the
    run: no row (a smaller dense batch would flatter ShadowKV)."""
    rows = []
    runs = multi_run(cases)
    for c in sorted((c for c in cases if c["method"] == "shadowkv" and c["impl"] == "kernel"), key=lambda c: (c["run"], row_key(c))):
        p, b = c["params"], c["b"]
        if int(p.get("B", 1)) < 2:
            continue
        wl = [p.get(k) for k in ("model", "ctx", "gen")]
        dense = [d for d in cases if d["method"] == "dense" and d["impl"] == "kernel" and d["run"] == c["run"]
                 and [d["params"].get(k) for k in ("model", "ctx", "gen")] == wl
                 and int(d["params"]["B"]) == d["b"].get("max_batch_device")]  # dense at its largest batch only
        if not dense:
            continue
        d = max(dense, key=lambda d: int(d["params"]["B"]))
        db = d["b"]
        Bs, Bd = int(p["B"]), int(d["params"]["B"])
        ts, td = b.get("median_us"), db.get("median_us")
        cs, cd = b.get("ceiling_us"), db.get("ceiling_us")
        thr = (Bs / ts) / (Bd / td) if ts and td else None
        bound = (Bs / cs) / (Bd / cd) if cs and cd else None
        goal, met = "–", "–"
        if thr and bound:
            if bound >= 3.0:
                goal, met = ">= 3x", "yes" if thr >= 3.0 else "no"
            else:
                goal, met = ">= 90% of bound ratio", "yes" if thr >= 0.9 * bound else "no"
        rows.append(([c["run"]] if runs else []) +
                    [ctx_k(p["ctx"]), p.get("budget", ""), Bs, us(ts), Bd,
                     "%d" % db["max_batch_device"] if "max_batch_device" in db else "–", us(td), ratio(thr),
                     us(cs), us(cd), ratio(bound), "%.1f%%" % (100 * thr / bound) if thr and bound else "–",
                     "%d" % b["max_batch_host"] if "max_batch_host" in b else "–",
                     "%.1f" % c["h2d_GBps"] if c.get("h2d_GBps") else "–", goal, met])
    return rows


def throughput_pivot(cases, method):
    """Table-3-like: tokens/s projected to 32 layers by context (rows; with the method's varying knobs)
    and batch (columns), impl=kernel; a case measured in several runs: its first run's value."""
    mc = [c for c in cases if c["method"] == method and c["impl"] == "kernel"]
    if not mc:
        return None
    cols, _ = method_columns(mc, method)
    knobs = [k for k in cols if k not in ("ctx", "B")]
    Bs = sorted({int(c["params"]["B"]) for c in mc})
    table = {}
    for c in sorted(mc, key=row_key):
        rk = tuple([int(c["params"]["ctx"])] + [c["params"].get(k, "") for k in knobs])
        table.setdefault(rk, {}).setdefault(int(c["params"]["B"]), tokens_per_s(c["b"]))
    rows = []
    for rk in sorted(table, key=lambda k: [k[0]] + [float(v) if v.replace(".", "", 1).isdigit() else 0 for v in k[1:]]):
        rows.append([ctx_k(rk[0])] + list(rk[1:]) + [us(table[rk].get(B)) for B in Bs])
    return md_table(["ctx"] + knobs + ["B=%d" % B for B in Bs], rows)


def shown_path(p):
    """a result file as the reader finds it: relative to the working directory (the repository root for
    `make publish` and `make step-report`) when it lies under it"""
    rel = os.path.relpath(os.path.abspath(p))
    return p if rel.startswith("..") else rel


def per_method_sections(cases, kernel, others, methods):
    """Each method's step against its bound, its throughput pivot and its stage breakdown."""
    out = []
    out += ["## Step time per method (impl=kernel)", "",
            "Bound: the step's bytes at the device read ceiling (goal: 1.2x it). tokens/s: B tokens per "
            "step of 32 such blocks. Speedup and bound ratio against dense at the same model, ctx, B, gen. "
            "Speedup % of bound ratio is (dense's time / bound) over this step's: not a ceiling, it passes 100% "
            "where this step is nearer its own bound than dense is to its.", ""]
    if others:
        out += ["Other impls in the file, not tabulated here: %s." % ", ".join(others), ""]
    for m in methods:
        mc = [c for c in kernel if c["method"] == m]
        _, const = method_columns(mc, m)
        out += ["### %s" % m, ""]
        if const:
            out += ["All cases: %s." % " ".join("%s=%s" % kv for kv in const), ""]
        out += [step_table(cases, mc, m), ""]

    out += ["## Decode throughput by context and batch, tokens/s projected to 32 layers (impl=kernel)", "",
            "B / (step time x 32), one block measured (ShadowKV's projection); omnikv per role (its model "
            "step is composed below). A case measured in several runs: its first run's value.", ""]
    for m in methods:
        t = throughput_pivot(cases, m)
        if t:
            out += ["### %s" % m, "", t, ""]

    out += ["## Latency breakdown per stage, us (impl=kernel)", "",
            "Device time of each stage, in run order; the sum differs from the step (timed whole) by "
            "launch gaps and per-stage timing.", ""]
    for m in methods:
        mc = [c for c in kernel if c["method"] == m]
        src_note = {c["stage_src"] for c in mc}
        out += ["### %s" % m, ""]
        if "canonical" in src_note:
            out += ["(stage order: no label listed it; the block's canonical order)", ""]
        out += [breakdown_table(mc, m), ""]
    return out


def write_tables(path, src, ctx, cases, linear=()):
    out = ["# decode_step report: %s" % device_name(ctx), "",
           "Source: %s" % ", ".join("`%s`" % shown_path(s) for s in src), ""]
    if ctx.get("kvbench_git_revision") or ctx.get("date"):
        out += ["Run: %s, kvbench %s." % (ctx.get("date", "?"), ctx.get("kvbench_git_revision", "?")), ""]
    kernel = sorted((c for c in cases if c["impl"] == "kernel"), key=row_key)
    others = sorted({c["impl"] for c in cases if c["impl"] != "kernel"})
    methods = methods_in_order(c for c in cases if c["impl"] == "kernel")  # the JSON's order

    if methods:
        out += per_method_sections(cases, kernel, others, methods)

    run_col = ["run"] if multi_run(cases) else []
    skv = shadowkv_rows(cases)
    if skv:
        out += ["## ShadowKV against dense at dense's largest batch (impl=kernel)", "",
                "As ShadowKV's Table 3: ShadowKV at the paper's batch, dense at the largest batch whose K, V for "
                "every layer fit the device beside the weights (a dense case whose B is its max_batch_device; "
                "without one in the run, no row), one block each, same run. Throughput: B / step time. Bound ratio: the same "
                "with each step's bound. Goal (kernels/step/NOTES.md): >= 3x where the bound ratio allows it, otherwise >= 90% "
                "of the bound ratio. max batch on host: ShadowKV's pinned values for every layer in this "
                "machine's memory. pinned H2D: the run's pinned host-to-device copy ceiling, the link ShadowKV's fetch "
                "rides (its rate moves between machines, and the throughput ratio with it).", "",
                md_table(run_col + ["ctx", "budget", "shadowkv B", "shadowkv us", "dense B", "dense max B",
                                    "dense us", "throughput ratio", "shadowkv bound us", "dense bound us",
                                    "bound ratio", "% of bound ratio", "shadowkv max B on host", "pinned H2D GB/s", "goal",
                                    "met"],
                         skv), ""]

    fixed = fixed_part_rows([c for c in cases if not multi_run(cases) or c["run"] == cases[0]["run"]], ctx)
    if fixed:
        out += ["## The block's fixed part against reading its weights (dense, impl=kernel)", "",
                "The block without its attention path (the norms, the four projections, RoPE, SiLU-gating) against "
                "its weights read once at the run's read ceiling; goal (kernels/step/NOTES.md): at most 1.1x. Two "
                "estimates from the same case: the step timed whole minus its attention path's stage-timed stages "
                "(low: those stages carry their own timing gaps), and the block's stages stage-timed (high: each "
                "carries its gap). Met: yes where the high one is within the goal, no where the low one is not.", "",
                md_table(["ctx", "B", "weights MB", "weights at read us", "step - attention path us",
                          "block stages us", "over weights", "goal", "met"], fixed), ""]

    if linear:
        out += ["## The block's projections alone against the read rate (block_linear)", "",
                "Each projection of the block benched alone as the step runs it (cublasGemmEx), bf16 weights "
                "[out, in] read once; goal (kernels/step/NOTES.md): at least 90% of the device read rate, from "
                "the same run's ceiling.", "",
                md_table((["run"] if any(c["run"] for c in linear) else []) +
                         ["B", "in x out", "weights MB", "us", "% of read", "of goal time", "met"],
                         linear_rows(linear)), ""]

    composed, per_role = omnikv_rows(cases)
    if composed or per_role:
        out += ["## OmniKV: the model's step from its layer roles (impl=kernel, no offload)", "",
                "One block measured per role; the model's step is t_omnikv = n_dense t_dense + n_filter t_filter + "
                "n_sparse t_sparse (layers dense+filter+sparse; OmniKV's 32-layer roles: 5 + 3 + 24) against "
                "dense's 32 t_dense, median step times; the bound ratio composes the bounds the same way. "
                "tokens/s: B per model step (blocks only). Goal (kernels/step/NOTES.md): >= 1.7x at 128K where the bound "
                "ratio allows it (B >= 2), otherwise >= 90% of the bound ratio.", ""]
        if composed:
            out += [md_table(run_col + ["ctx", "B", "budget", "layers", "omnikv model us", "dense model us", "speedup",
                              "omnikv bound us", "dense bound us", "bound ratio", "speedup % of bound ratio",
                              "omnikv tokens/s", "dense tokens/s", "goal", "met"], composed), ""]
        else:
            out += ["(no workload has a filter, a sparse and a dense case: nothing to compose)", ""]
        out += ["Per role (one block):", "",
                md_table(run_col + ["ctx", "B", "budget", "role", "layers", "step us", "bound us", "dense step us",
                          "speedup vs dense"], per_role), ""]

    dense_peer = sorted((c for c in cases if c["method"] == "dense"
                         and any(k.startswith(PEER_PREFIX) for k in c["b"])), key=lambda c: (row_key(c), c["impl"] != "kernel"))
    if dense_peer:
        out += ["## Dense step against the PyTorch block peers (same run)", "",
                "Peers: the PyTorch block (`%s*` in the JSON). peer / suite > 1: the suite is faster." % PEER_PREFIX, "", peer_table(dense_peer), ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def write_stages_dat(path, cases):
    """One row per kernel case: a quoted label, the four stage groups and the step (timed whole) in us
    (gnuplot input)."""
    kernel = sorted((c for c in cases if c["impl"] == "kernel"), key=row_key)
    methods = methods_in_order(c for c in cases if c["impl"] == "kernel")  # the JSON's order
    named = {s for _, ss in GROUPS if ss for s in ss}
    lines = ["# decode_step stage groups, us (impl=kernel); attention = every stage not in another group;",
             "# a case measured in several runs: its first run's times",
             "# (stages on a side stream overlap the main stream's, so a group sum can pass the step time)",
             "# case " + " ".join(g for g, _ in GROUPS) + " step"]
    seen, once = set(), []
    for c in kernel:
        key = tuple(sorted(c["params"].items()))
        if key not in seen:
            seen.add(key)
            once.append(c)
    kernel = once
    for m in methods:
        mc = [c for c in kernel if c["method"] == m]
        cols, _ = method_columns(mc, m)
        for c in mc:
            p = c["params"]
            label = "%s B=%s %s" % (m, p.get("B", "?"), ctx_k(p.get("ctx", "0")))
            label += "".join(" %s=%s" % ("T" if k == "budget" else k, p[k]) for k in cols[2:] if k in p)
            if not c["stages"]:
                lines.append("# %s: no stage times" % label)
                continue
            vals = [sum(v for s, v in c["stages"].items() if (s in ss if ss else s not in named))
                    for _, ss in GROUPS]
            vals.append(c["b"].get("median_us", float("nan")))
            lines.append('"%s" ' % label + " ".join("%.2f" % v for v in vals))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    src, outdir = argv[1:-1], argv[-1]
    ctx, cases, linear = {}, [], []
    for path in src:
        with open(path) as f:
            doc = json.load(f)
        run = run_name(path) if len(src) > 1 else ""
        c_ctx, c_cases = load_cases(doc, run)
        ctx = ctx or c_ctx
        cases += c_cases
        linear += load_linear(doc, run)
    if not cases and not linear:
        sys.stderr.write("step_report: no %s or block_linear cases in %s\n" % (OP, " ".join(src)))
        return 1
    os.makedirs(outdir, exist_ok=True)
    write_tables(os.path.join(outdir, "tables.md"), src, ctx, cases, linear)
    write_stages_dat(os.path.join(outdir, "stages.dat"), cases)
    print("step_report: %d cases -> %s/tables.md, %s/stages.dat" % (len(cases) + len(linear), outdir, outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
