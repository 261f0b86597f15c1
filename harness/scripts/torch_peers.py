#!/usr/bin/env python3
"""torch_peers.py: the external peers the family notes name, timed on the same GPU in the same round as kvbench,
written as a peers file that `kvbench bench --peers FILE` reads, so that every ratio to an external
peer comes from one run (nothing is typed in).

Peers (each entry names the kvbench kernel and the case keys it matches):
  selective_attn  SDPA causal forward, bf16, B=1, H=32, D=128, cuDNN backend (torch_sdpa_cudnn_fwd)
                  and flash backend (torch_sdpa_flash_fwd), L in --lengths
  decode_attn     SDPA decode (one query token per head, GQA by expanded K/V heads: enable_gqa),
                  cuDNN / flash / efficient backends, B in {1, 8}, L in {32768, 131072}
  topk            torch.topk(sorted=False) on fp32 [rows, n] at the top-k bench shapes (torch_topk)
  shadowkv_lowrank  torch.linalg.svd(full_matrices=False) of fp32 Kpre [S, Hkv*D] on the GPU, as ShadowKV
                  factors its keys (torch_linalg_svd), and torch.svd_lowrank(q=r, niter=2)
                  (torch_svd_lowrank), at S=32768, Hkv*D = 8*128 and 4*128, r=160
  decode_step     method=dense, model=llama3-8b: one Llama block decoding one token for B sequences as a
                  PyTorch user writes it (F.rms_norm, F.linear, rotate-half RoPE, cache row ctx written by
                  index_copy_, SDPA with enable_gqa, F.silu), captured as a CUDA graph and replayed, per SDPA
                  backend (torch_block_{cudnn,flash,efficient}_graph), and eager with the fastest backend
                  (torch_block_<backend>_eager), (B, ctx) in --block-shapes

Optional: needs python3 with torch and a CUDA device; nothing in kvbench depends on it.

    python3 harness/scripts/torch_peers.py --out peers.json [--only sdpa,decode,topk,svd,block]

Timing follows kvbench's method where Python allows: inputs from a fixed seed (never zeros),
3 warm-up launches, then per sample an L2 flush (a write of twice the L2 size) outside the timed
region, CUDA events around one launch, the median of at least --min-samples samples.
"""
import argparse
import json
import statistics
import sys


def time_it(torch, fn, flush, min_samples, min_seconds):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, spent = [], 0.0
    while len(times) < min_samples or spent < min_seconds:
        flush.zero_()
        torch.cuda.synchronize()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop)
        times.append(ms * 1e3)
        spent += ms * 1e-3
        if len(times) >= 2000:
            break
    mean = statistics.fmean(times)
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times),
            "noise_pct": 100 * (statistics.stdev(times) / mean if len(times) > 1 else 0.0), "samples": len(times)}


LLAMA3_8B = {"hidden": 4096, "Hq": 32, "Hkv": 8, "D": 128, "ffn": 14336, "theta": 500000.0, "eps": 1e-5}


def block_tensors(torch, m, B, ctx, dev, g, dtype):
    """The inputs of decode_step dense: seeded like the suite's case (weights normal / sqrt(fan_in), norms
    1 + 0.1 normal, x and the cache normal), K and V at ctx + 1 rows, the RoPE cos/sin of position ctx."""
    hidden, Hq, Hkv, D, ffn = m["hidden"], m["Hq"], m["Hkv"], m["D"], m["ffn"]

    def randn(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, device=dev, generator=g) * scale + shift).to(dtype)

    t = {"x": randn(B, hidden), "norm1": randn(hidden, scale=0.1, shift=1.0),
         "norm2": randn(hidden, scale=0.1, shift=1.0)}
    for name, out, inp in (("wqkv", (Hq + 2 * Hkv) * D, hidden), ("wo", hidden, Hq * D), ("wgu", 2 * ffn, hidden),
                           ("wdown", hidden, ffn)):
        t[name] = randn(out, inp, scale=inp ** -0.5)
    # the cache in bf16 directly: at B=8, 128K an fp32 temporary would double its 2 GB
    t["K"] = torch.randn(B, Hkv, ctx + 1, D, device=dev, dtype=dtype, generator=g)
    t["V"] = torch.randn(B, Hkv, ctx + 1, D, device=dev, dtype=dtype, generator=g)
    # llama's rotate-half table at one position: angles in double (ctx * freq reaches 1e5 rad, past fp32's
    # resolution), then bf16 like the suite's table; cat(f, f) so both halves of a head use the same angle
    inv_freq = 1.0 / m["theta"] ** (torch.arange(0, D, 2, dtype=torch.float64, device=dev) / D)
    ang = torch.cat((ctx * inv_freq, ctx * inv_freq))
    t["cos"], t["sin"] = ang.cos().to(dtype), ang.sin().to(dtype)
    t["pos"] = torch.tensor([ctx], device=dev)  # on the device: a graph replays it without a host copy
    return t


def block_step(torch, F, m, t):
    """One dense decode step over the tensors of block_tensors: returns y [B, hidden]; writes row ctx of K, V
    (the same row every call, so replays repeat the same work)."""
    Hq, Hkv, D, eps = m["Hq"], m["Hkv"], m["D"], m["eps"]
    x, K, V, cos, sin, pos = t["x"], t["K"], t["V"], t["cos"], t["sin"], t["pos"]
    B = x.shape[0]
    if hasattr(F, "rms_norm"):  # torch >= 2.4
        def rms_norm(h, w):
            return F.rms_norm(h, (h.shape[-1],), w, eps)
    else:
        def rms_norm(h, w):
            hf = h.float()
            return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * w

    def rope(h):
        h1, h2 = h.chunk(2, dim=-1)
        return h * cos + torch.cat((-h2, h1), dim=-1) * sin

    def step():
        qkv = F.linear(rms_norm(x, t["norm1"]), t["wqkv"]).view(B, Hq + 2 * Hkv, D)
        q, k, v = qkv.split((Hq, Hkv, Hkv), dim=1)
        q, k = rope(q), rope(k)
        K.index_copy_(2, pos, k.unsqueeze(2))  # a static cache's append (HF's StaticCache does the same)
        V.index_copy_(2, pos, v.unsqueeze(2))
        att = F.scaled_dot_product_attention(q.unsqueeze(2), K, V, enable_gqa=True)  # [B, Hq, 1, D]
        h = x + F.linear(att.reshape(B, Hq * D), t["wo"])
        gate, up = F.linear(rms_norm(h, t["norm2"]), t["wgu"]).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, t["wdown"])

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096,16384,32768")
    ap.add_argument("--only", default="sdpa,decode,topk,svd,block")
    ap.add_argument("--block-shapes", default="1x32768,1x131072,8x32768,8x131072", help="BxCTX,... for decode_step")
    ap.add_argument("--min-samples", type=int, default=10)
    ap.add_argument("--min-seconds", type=float, default=0.3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # depends on the machine
        print(f"torch_peers: torch unavailable ({e}); nothing timed")
        return 0
    if not torch.cuda.is_available():
        print("torch_peers: no CUDA device; nothing timed")
        return 0
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device=dev)
    only = set(args.only.split(","))
    peers = []
    g = torch.Generator(device=dev)

    def add(kernel, match, name, t, **extra):
        e = {"kernel": kernel, "match": match, "peer": name, **t, **extra}
        peers.append(e)
        print(f"{kernel:15s} {json.dumps(match):60s} {name:26s} {t['median_us']:12.1f} us  noise {t['noise_pct']:.1f}%",
              flush=True)

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    if "sdpa" in only:  # selective_attn's peers: the causal prefill forward, no column sums
        B, H, D = 1, 32, 128
        for L in [int(x) for x in args.lengths.split(",")]:
            g.manual_seed(1)
            q, k, v = (torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
            for bname in ("cudnn", "flash"):
                try:
                    with sdpa_kernel([backends[bname]]):
                        t = time_it(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), flush,
                                    args.min_samples, args.min_seconds)
                except RuntimeError as e:
                    print(f"selective_attn L={L} {bname}: not available ({str(e).splitlines()[0]})")
                    continue
                flops = 4.0 * B * H * D * L * (L + 1) / 2
                add("selective_attn", {"B": B, "Hq": H, "Hkv": H, "L": L, "D": D, "causal": 1},
                    f"torch_sdpa_{bname}_fwd", t, TFLOPs=flops / (t["median_us"] * 1e-6) * 1e-12)
            del q, k, v
            torch.cuda.empty_cache()
    if "decode" in only:  # decode_attn's peers: one query token, GQA 32/8, D=128
        Hq, Hkv, D = 32, 8, 128
        for B, L in ((8, 32768), (8, 131072), (1, 32768), (1, 131072)):
            g.manual_seed(2)
            q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16, generator=g)
            k = torch.randn(B, Hkv, L, D, device=dev, dtype=torch.bfloat16, generator=g)
            v = torch.randn(B, Hkv, L, D, device=dev, dtype=torch.bfloat16, generator=g)
            for bname in ("cudnn", "flash", "efficient"):
                try:
                    with sdpa_kernel([backends[bname]]):
                        t = time_it(torch, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), flush,
                                    args.min_samples, args.min_seconds)
                except RuntimeError as e:
                    print(f"decode_attn B={B} L={L} {bname}: not available ({str(e).splitlines()[0]})")
                    continue
                add("decode_attn", {"B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "L": L, "len": 0, "vary": 0},
                    f"torch_sdpa_{bname}", t)
            del q, k, v
            torch.cuda.empty_cache()
    if "topk" in only:  # the top-k bench shapes (kernels/select/NOTES.md)
        for rows, n, k in ((256, 131072, 4096), (1, 131072, 2048), (32, 32768, 2048), (8, 16384, 256),
                           (1, 2097152, 8192)):
            g.manual_seed(3)
            x = torch.randn(rows, n, device=dev, dtype=torch.float32, generator=g)
            t = time_it(torch, lambda: torch.topk(x, k, dim=1, largest=True, sorted=False), flush,
                        args.min_samples, args.min_seconds)
            add("topk", {"rows": rows, "n": n, "k": k}, "torch_topk", t)
            del x
            torch.cuda.empty_cache()
    if "svd" in only:  # shadowkv_lowrank's peers: the factorization of one layer's pre-RoPE keys
        S, D, r = 32768, 128, 160
        for Hkv in (8, 4):
            g.manual_seed(4)
            x = torch.randn(S, Hkv * D, device=dev, dtype=torch.float32, generator=g)
            match = {"S": S, "Hkv": Hkv, "D": D, "r": r}
            t = time_it(torch, lambda: torch.linalg.svd(x, full_matrices=False), flush, args.min_samples,
                        args.min_seconds)
            add("shadowkv_lowrank", match, "torch_linalg_svd", t)
            t = time_it(torch, lambda: torch.svd_lowrank(x, q=r, niter=2), flush, args.min_samples, args.min_seconds)
            add("shadowkv_lowrank", match, "torch_svd_lowrank", t)
            del x
            torch.cuda.empty_cache()
    if "block" in only:  # decode_step dense's peers: the whole block, graphed per SDPA backend, and eager
        m = LLAMA3_8B
        welems = (2 * m["hidden"] + (m["Hq"] + 2 * m["Hkv"]) * m["D"] * m["hidden"] + m["hidden"] * m["Hq"] * m["D"]
                  + 3 * m["ffn"] * m["hidden"])
        for shape in args.block_shapes.split(","):
            B, ctx_len = (int(v) for v in shape.split("x"))
            g.manual_seed(5)
            t = block_tensors(torch, m, B, ctx_len, dev, g, torch.bfloat16)
            step = block_step(torch, F, m, t)
            match = {"method": "dense", "model": "llama3-8b", "B": B, "ctx": ctx_len}
            nbytes = 2 * welems + 2 * 2 * B * m["Hkv"] * (ctx_len + 1) * m["D"]
            graphed = {}
            for bname in ("cudnn", "flash", "efficient"):
                graph = y = None
                try:
                    with sdpa_kernel([backends[bname]]):
                        # warm up on a side stream before capture (the torch.cuda.graphs recipe): lazy
                        # init, cuBLAS handles and workspaces stay out of the graph
                        side = torch.cuda.Stream()
                        side.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(side):
                            for _ in range(3):
                                step()
                        torch.cuda.current_stream().wait_stream(side)
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            y = step()  # the static output: each replay rewrites it
                    tm = time_it(torch, graph.replay, flush, args.min_samples, args.min_seconds)
                except RuntimeError as e:
                    print(f"decode_step B={B} ctx={ctx_len} {bname} graph: not available ({str(e).splitlines()[0]})")
                    del graph, y
                    torch.cuda.synchronize()
                    continue
                graphed[bname] = tm["median_us"]
                add("decode_step", match, f"torch_block_{bname}_graph", tm, bytes=nbytes)
                del graph, y  # each graph holds a private memory pool
            # eager with the fastest graphed backend; with none graphed, the first that runs
            for bname in sorted(graphed, key=graphed.get) or ("cudnn", "flash", "efficient"):
                try:
                    with sdpa_kernel([backends[bname]]):
                        tm = time_it(torch, step, flush, args.min_samples, args.min_seconds)
                except RuntimeError as e:
                    print(f"decode_step B={B} ctx={ctx_len} {bname} eager: not available ({str(e).splitlines()[0]})")
                    continue
                add("decode_step", match, f"torch_block_{bname}_eager", tm, bytes=nbytes)
                break
            del t, step
            torch.cuda.empty_cache()
    ctx = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": props.name,
           "cudnn": str(torch.backends.cudnn.version()), "command_line": " ".join(sys.argv)}
    with open(args.out, "w") as f:
        json.dump({"context": ctx, "peers": peers}, f, indent=1)
    print(f"torch_peers: {len(peers)} peers timed on {props.name} (torch {torch.__version__}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
