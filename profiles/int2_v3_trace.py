#!/usr/bin/env python3
"""int2_v3_trace.py TRACE...: medians of the per-block clocks of int2_decode_attn v3's trace.

A trace is the output of `kvbench profile CASE` from the diagnostic build (`make KVB_TRACE=1`, which
compiles the trace into v3's kernel; production builds carry none): per launch one line per block,
  TR3 kb smid head s0 s1 steps t0_ns end_ns c1 .. c20
where c_i is the SM clock at point i minus the clock at the block's start (-1: not reached) and the
two globaltimer stamps give the clock rate; and one more per block,
  TR3X kb c21 .. c28
(warp 1's first claims: before, after, past q's wait; warp 0's second claim in the step loop: before,
after the shared counter, after the expected bytes, after the copies; warp 1's first step). Only the last launch (the profiled one, the last 128 or
fewer lines with the same start) is read. Blocks are split by whether they hold the head's residual
steps (s0 == 0: rank 0 of the head's cluster) or not. Times in us from the first block's start."""
import statistics as st
import sys

# point i of the kernel's trace (kernels/int2/int2_decode.cu, v3::attn_kernel), in program order
POINTS = [(13, "mbar init"), (14, "split"), (15, "segment"), (12, "barrier 0"), (6, "first fill"),
          (7, "q staged"), (16, "q frags (warp 0)"), (1, "q frags (barrier)"), (2, "first step"),
          (8, "after 1 step"), (9, "after 2 steps"), (3, "warp 0 done"), (4, "all warps done"),
          (11, "deposited"), (17, "cluster wait"), (18, "combined"), (19, "cluster sync"), (5, "merged")]
EXTRA = [(21, "warp 1: ramp claims begin"), (22, "warp 1: ramp claims end"), (23, "warp 1: past q's wait"),
         (28, "warp 1: first step"), (24, "warp 0: claim 1 begins"), (25, "warp 0: claim 1, counter"),
         (26, "warp 0: claim 1, expected bytes"), (27, "warp 0: claim 1 ends")]


def summarize(path):
    rows = [l.split() for l in open(path) if l.startswith("TR3 ")]
    if not rows:
        return f"{path}: no TR3 lines"
    rows = rows[-128:]
    extra = {}
    for l in open(path):
        if l.startswith("TR3X "):
            f = l.split()
            extra[f[1]] = f[2:]  # the last launch's line of block kb wins
    t0 = min(int(r[7]) for r in rows)
    ghz = st.median([int(r[8 + 5]) / (int(r[8]) - int(r[7])) for r in rows])  # clocks per ns to "merged"
    out = [f"{path} (clock {ghz:.2f} GHz, {len(rows)} blocks)", "| point | rank 0 (residual) us | other us |",
           "|---|---:|---:|"]
    groups = [[r for r in rows if int(r[4]) == 0], [r for r in rows if int(r[4]) != 0]]
    for i, name in POINTS:
        cells = []
        for g in groups:
            v = [(int(r[7]) - t0) / 1000 + int(r[8 + i]) / ghz / 1000 for r in g if int(r[8 + i]) > 0]
            cells.append(f"{st.median(v):.2f}" if v else "-")
        out.append(f"| {name} | {cells[0]} | {cells[1]} |")
    for i, name in EXTRA if extra else []:
        cells = []
        for g in groups:
            v = [(int(r[7]) - t0) / 1000 + int(extra[r[1]][i - 21]) / ghz / 1000 for r in g
                 if r[1] in extra and int(extra[r[1]][i - 21]) > 0]
            cells.append(f"{st.median(v):.2f}" if v else "-")
        out.append(f"| {name} | {cells[0]} | {cells[1]} |")
    ends = [[(int(r[8]) - t0) / 1000 for r in g] for g in groups]
    out.append("| block end | " + " | ".join(f"{st.median(e):.2f}" if e else "-" for e in ends) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("\n\n".join(summarize(p) for p in sys.argv[1:]))
