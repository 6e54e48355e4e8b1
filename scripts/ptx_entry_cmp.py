#!/usr/bin/env python3
# scripts/ptx_entry_cmp.py BASE.ptx NEW.ptx — compares each .entry of BASE with the entry of the same
# name in NEW, with the per-function label prefix ($L__BB<function index>_) normalised (adding a
# kernel to a file renumbers the functions after it).  Used to show that a change leaves the
# default kernels' code unchanged:  nvcc ... -gencode=arch=compute_90a,code=compute_90a -ptx FILE.cu
import re
import sys


def entries(fn):
    s = open(fn).read()
    idx = [m.start() for m in re.finditer(r'^\.visible \.entry |^\.entry ', s, flags=re.M)]
    d = {}
    for i, st in enumerate(idx):
        en = idx[i + 1] if i + 1 < len(idx) else len(s)
        blk = s[st:en]
        blk = blk[:blk.index('\n}\n') + 3]
        name = re.search(r'\.entry (\S+)\(', blk).group(1)
        d[name] = re.sub(r'\$L__BB\d+_', '$L__BB_', blk)
    return d


b, n = entries(sys.argv[1]), entries(sys.argv[2])
bad = 0
for k in b:
    same = b[k] == n.get(k)
    bad += not same
    print(f"{k}: {'identical (labels normalised), %d lines' % b[k].count(chr(10)) if same else 'DIFFERENT or missing'}")
for k in n:
    if k not in b:
        print(f"{k}: new")
sys.exit(1 if bad else 0)
