#!/usr/bin/env python3
"""Summarise an Nsight Compute source page (CSV, SASS) of one kernel: stall samples by reason,
the instructions with the most samples, and the samples of each executed-instruction region
(scripts/dev/ncu_source.sh writes sass_source.csv.gz).
  ncu_source_top.py FILE.csv[.gz] [--top N] [--context K]"""
import csv, gzip, sys
from collections import Counter

def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 40
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    rows = list(csv.reader(raw))
    hdr_i = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr = rows[hdr_i]
    col = {n: i for i, n in enumerate(hdr)}
    body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
    stall_cols = [n for n in hdr if n.startswith("stall_") and "(Not Issued)" not in n]
    num = lambda r, n: float(r[col[n]] or 0) if r[col[n]] not in ("", "-") else 0.0
    tot = Counter()
    for r in body:
        for n in stall_cols:
            tot[n] += num(r, n)
    all_s = sum(num(r, "Warp Stall Sampling (All Samples)") for r in body)
    execd = sum(num(r, "Instructions Executed") for r in body)
    print(f"instructions {len(body)}, samples {all_s:.0f}, warp instructions executed {execd:.0f}")
    for n, v in tot.most_common(12):
        print(f"  {n:28s} {v:9.0f}  {100 * v / max(all_s, 1):5.1f} %")
    print(f"\ntop {top} instructions by samples (address, samples, executed, top stalls, SASS):")
    ranked = sorted(range(len(body)), key=lambda i: -num(body[i], "Warp Stall Sampling (All Samples)"))
    for i in ranked[:top]:
        r = body[i]
        st = sorted(((num(r, n), n[6:]) for n in stall_cols), reverse=True)[:3]
        sts = ", ".join(f"{n} {v:.0f}" for v, n in st if v > 0)
        print(f"  {i:5d} {num(r, 'Warp Stall Sampling (All Samples)'):7.0f} {num(r, 'Instructions Executed'):9.0f}  "
              f"{sts:40s} {r[col['Source']].strip()[:70]}")
    # opcode classes weighted by executions and by samples
    ops_e, ops_s = Counter(), Counter()
    for r in body:
        op = r[col["Source"]].strip().split()
        if not op:
            continue
        o = op[0] if not op[0].startswith("@") else (op[1] if len(op) > 1 else op[0])
        o = o.split(".")[0]
        ops_e[o] += num(r, "Instructions Executed")
        ops_s[o] += num(r, "Warp Stall Sampling (All Samples)")
    print("\nopcodes: executed (share), samples (share)")
    for o, v in ops_e.most_common(25):
        print(f"  {o:10s} {v:11.0f} {100 * v / max(execd, 1):5.1f} %   {ops_s[o]:8.0f} {100 * ops_s[o] / max(all_s, 1):5.1f} %")

if __name__ == "__main__":
    main()
