#!/usr/bin/env python3
"""ncu_excerpt.py LOG... : a markdown table from Nsight Compute's text output (the SpeedOfLight,
LaunchStats and Occupancy sections, as profiles/trust_round.sh's ncu phase writes them), one row per
profiled kernel launch: duration, DRAM and memory throughput and compute (SM) throughput as % of the
device's peak (ncu's own figures, clocks left as the card had them), registers and achieved occupancy.
The family is the log's file name."""
import os
import re
import sys

METRICS = {
    "Duration": "dur",
    "DRAM Throughput": "dram",
    "Memory Throughput": "mem",
    "Compute (SM) Throughput": "sm",
    "Registers Per Thread": "regs",
    "Achieved Occupancy": "occ",
    "SM Frequency": "clk",
}


def parse(path):
    launches, cur = [], None
    for line in open(path, errors="replace"):
        m = re.match(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context", line)
        if m:
            cur = {"kernel": m.group(1), "grid": "x".join(m.group(i) for i in (2, 3, 4)),
                   "block": "x".join(m.group(i) for i in (5, 6, 7))}
            launches.append(cur)
            continue
        if cur is None:
            continue
        m = re.match(r"^\s{4}(\S.*?)\s{2,}(\S+)?\s+([\d,.]+)\s*$", line)
        if m and m.group(1).strip() in METRICS:
            key = METRICS[m.group(1).strip()]
            cur[key] = m.group(3).replace(",", "")
            if key == "dur":
                cur["dur_unit"] = m.group(2)
    return launches


def short(kernel):
    k = re.sub(r"\(.*$", "", kernel)  # drop the parameter list
    k = re.sub(r"^void ", "", k).replace("<unnamed>::", "")
    return k if len(k) <= 60 else k[:57] + "..."


def main():
    print("| family | kernel | grid x block | time | DRAM % | memory % | SM % | regs | achieved occupancy % | SM GHz |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        fam = os.path.splitext(os.path.basename(path))[0]
        launches = parse(path)
        if not launches:
            print(f"| {fam} | (no kernel profiled: see the log) | | | | | | | | |")
        for L in launches:
            t = f"{L.get('dur', '?')} {L.get('dur_unit', '')}".strip()
            print(f"| {fam} | `{short(L['kernel'])}` | {L['grid']} x {L['block']} | {t} | {L.get('dram', '?')} | "
                  f"{L.get('mem', '?')} | {L.get('sm', '?')} | {L.get('regs', '?')} | {L.get('occ', '?')} | {L.get('clk', '?')} |")


if __name__ == "__main__":
    main()
