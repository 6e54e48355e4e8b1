#!/usr/bin/env python3
"""The landing rate of a whole-page decode call, or of a bulk-copy gather, over time, from their CSV.

Build with -DKVATTN_PAGE_TIMELINE_TOOL=1, run e.g.
  KVATTN_PAGE_TIMELINE=20,3 KVATTN_PAGE_TIMELINE_DUMP=d.csv KVATTN_GATHER_TIMELINE_DUMP=g.csv \
    kvattn bench-cuda --batch 64 --kv-len 4096 --kept-plan
then `python3 scripts/timeline_progress.py d.csv g.csv` (a gather's "chunk" is a whole 64 KB page,
a decode's half a page's K and V, 32 KB).  Each CTA's row holds the time its first chunk
landed and 16 progress stamps (when the last chunk of each sixteenth of its range landed); between
stamps its progress is taken as linear.  Summed over CTAs on a 1 us grid this gives the chunks
landed per us; printed against the median rate of the span's middle half, with the time that
falls short of it (us of that rate) in the first 20 us, the middle and the last 60 us.
"""
import csv
import sys


def progress_points(row):
    chunks = int(row[3])
    first = float(row[5])
    stamps = [float(x) for x in row[8:24]]
    pts = [(first, 1)]
    for k, t in enumerate(stamps):
        if t < 0:
            continue
        last = max((i for i in range(chunks) if i * 16 // chunks == k), default=None)
        if last is not None:
            pts.append((t, last + 1))
    return sorted(pts)


def landed(pts, t):
    if t < pts[0][0]:
        return 0.0
    for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
    return pts[-1][1]


def report(name, rows):
    ctas = [progress_points(r) for r in rows if int(r[3]) > 0]
    total = sum(int(r[3]) for r in rows)
    span = max(float(r[7]) for r in rows)
    n = int(span) + 2
    done = [sum(landed(p, float(i)) for p in ctas) for i in range(n)]
    rate = [done[i + 1] - done[i] for i in range(n - 1)]
    mid = sorted(rate[len(rate) // 4: 3 * len(rate) // 4])
    ref = mid[len(mid) // 2]
    short = [max(0.0, 1.0 - x / ref) for x in rate]
    end = int(span) - 60
    print(f"{name}: span {span:.1f} us, {total} chunks, last landed {max(p[-1][0] for p in ctas):.1f} us; "
          f"middle rate {ref:.1f} chunks/us (all chunks at it: {total / ref:.1f} us)")
    print(f"  short of it: first 20 us {sum(short[:20]):.2f} us, middle {sum(short[20:end]):.2f} us, "
          f"last 60 us {sum(short[end:]):.2f} us")
    print("  rate / middle rate per 5 us over the last 60 us: "
          + " ".join(f"{sum(rate[i:i + 5]) / 5 / ref:.2f}" for i in range(end, int(span), 5)))


def main():
    for path in sys.argv[1:]:
        launches = {}
        for row in csv.reader(open(path)):
            launches.setdefault(row[0], []).append(row)
        for launch, rows in launches.items():
            report(f"{path} launch {launch}", rows)


if __name__ == "__main__":
    main()
