#!/usr/bin/env python3
"""torch_flash_peer.py: the external peer of selective_attn.md, timed on the same device in the same run
as kvbench: PyTorch's fused flash-attention forward (scaled_dot_product_attention restricted to the
flash backend), bf16, causal, B=1, H=32, D=128, no column sums.

Optional: it needs python3 with torch and a CUDA device; nothing in kvbench depends on it.

    python3 harness/torch_flash_peer.py [--lengths 4096,16384,32768] [--out FILE.json]

Timing follows kvbench's method where Python allows: inputs N(0, 1) from a fixed seed (never zeros),
3 warm-up launches, then per sample an L2 flush (writing a buffer twice the L2 size) outside the timed
region, CUDA events around one launch, the median of the samples. FLOPs: 4 * B * H * D * L(L+1)/2 (Q K^T
and P V over the causal pairs), as kvbench counts them.
"""
import argparse
import json
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096,16384,32768")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--min-samples", type=int, default=10)
    ap.add_argument("--min-seconds", type=float, default=0.5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # pragma: no cover - depends on the machine
        print(f"torch_flash_peer: torch unavailable ({e}); nothing timed")
        return 0
    if not torch.cuda.is_available():
        print("torch_flash_peer: no CUDA device; nothing timed")
        return 0
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device=dev)
    B, H, D = 1, args.heads, args.dim
    rows = []
    for L in [int(x) for x in args.lengths.split(",")]:
        g = torch.Generator(device=dev)
        g.manual_seed(1)
        q, k, v = (torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            for _ in range(3):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.cuda.synchronize()
            times, spent = [], 0.0
            while len(times) < args.min_samples or spent < args.min_seconds:
                flush.zero_()
                torch.cuda.synchronize()
                start.record()
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                stop.record()
                stop.synchronize()
                ms = start.elapsed_time(stop)
                times.append(ms)
                spent += ms * 1e-3
                if len(times) >= 1000:
                    break
        del out
        med = statistics.median(times)
        flops = 4.0 * B * H * D * L * (L + 1) / 2
        mean = statistics.fmean(times)
        noise = statistics.pstdev(times) / mean if len(times) > 1 else 0.0
        rows.append({"L": L, "B": B, "H": H, "D": D, "causal": True, "median_ms": med, "min_ms": min(times),
                     "max_ms": max(times), "noise_pct": 100 * noise, "samples": len(times),
                     "TFLOPs": flops / (med * 1e-3) * 1e-12})
        del q, k, v
        torch.cuda.empty_cache()
    ctx = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": props.name,
           "backend": "SDPBackend.FLASH_ATTENTION", "command_line": " ".join(sys.argv)}
    print(f"torch_flash_peer: {props.name}, torch {torch.__version__}, flash backend, bf16, causal, B={B}, H={H}, D={D}")
    print("| L | median ms | min..max ms | noise | TFLOP/s |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['L']} | {r['median_ms']:.3f} | {r['min_ms']:.3f}..{r['max_ms']:.3f} | {r['noise_pct']:.1f}% | {r['TFLOPs']:.1f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"context": ctx, "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
