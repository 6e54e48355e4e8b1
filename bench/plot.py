#!/usr/bin/python3
"""Plots of `kvattn bench-cuda` results next to FlashInfer's figures on the same GPU.

    /usr/bin/python3 bench/plot.py RESULT [--anchors FILE] [--out DIR] [--table]

RESULT is what `kvattn bench-cuda --json` writes (see SCHEMA below) or, for older binaries, the
plain-text table `kvattn bench-cuda` prints (the same rows, one per line).  The FlashInfer
figures come from bench/flashinfer_h200.json (FlashInfer's kernels timed with the same setup on
one H200).  Writes three PNGs into DIR (default docs/img):

  decode_bandwidth.png  decode TB/s by batch x kv length: kvattn, FlashInfer, and the device-copy
                        ceiling measured in the same run
  prefill_tflops.png    prefill TFLOP/s: kvattn, FlashInfer's FA2 and FA3 paged paths, and the
                        tensor-core ceilings (mma.sync; wgmma when measured) of the same run
  speed_ratio.png       kvattn's speed / FlashInfer's for every shape both measured (> 1: faster)

Each PNG carries the figures it shows as JSON in its "kvattn-data" text chunk, so a test (and a
reader) can check a plot against its input without reading pixels.  --table prints the same
figures as a Markdown table (the side-by-side table of docs/PERFORMANCE.md).

SCHEMA (kvattn bench-cuda --json), one object:
  {"device": "NVIDIA H200", "sms": 132,
   "rows": [{"name": "decode bf16 64x4096 [plan kept]", "us": 252.1, "value": 4.26,
             "unit": "TB/s", "target": ">= 4.4 TB/s"}, ...]}
  A row is one printed line: its name, the median time in microseconds (0 for a ceiling that is a
  rate only), the rate in `unit` ("TB/s", "TFLOP/s" or "" for a time only) and the target text.
  The rows this script reads, by name:
    "ceiling: device copy ..."            same-run copy bandwidth (TB/s, bytes read + written)
    "ceiling: mma.sync bf16 ..."          same-run tensor-core rate (TFLOP/s)
    "ceiling: wgmma bf16 ..."             same-run Hopper tensor-core rate (TFLOP/s), when present
    "decode <dtype> BxL [plan kept]"      decode, dtype "bf16" or "fp8 e4m3"; L may be U[lo,hi]
    "decode <dtype> BxL"                  the same, for shapes the bench runs untagged only
    "prefill causal|non-causal bf16 BxL [plan kept]"   L may be "(q Lq, kv L)" (a chunked prefill);
                                          a trailing "[wgmma]" / "[mma.sync]" names the kernel
    "KV write (reshape_and_cache) T tokens", "merge_attn_states Tx32x128"
  Rows with other tags ([plan per call], diagnostics) are ignored; a kept-plan row wins over an
  untagged one, and where a shape has several (repeats: "(again)") the fastest is used.
"""
import argparse
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ANCHORS = os.path.join(HERE, "flashinfer_h200.json")
DEFAULT_OUT = os.path.join(HERE, os.pardir, "docs", "img")

# One text row of `kvattn bench-cuda`: name, median us, rate, unit (may be empty), target.
_TEXT_ROW = re.compile(
    r"^(?P<name>\S.*?)\s+(?P<us>-?\d+(?:\.\d+)?) us\s+(?P<value>-?\d+(?:\.\d+)?) ?(?P<unit>TB/s|TFLOP/s|GB/s)?\s*(?P<target>.*)$")
_DECODE = re.compile(r"^decode (?P<dtype>bf16|fp8 e4m3) (?P<b>\d+)x(?P<l>\d+|U\[\d+,\s*\d+\])\s*(?P<tags>.*)$")
_PREFILL = re.compile(r"^prefill (?P<mask>causal|non-causal) bf16 (?P<b>\d+)x(?:(?P<l>\d+)|\(q (?P<lq>\d+), kv (?P<lkv>\d+)\))"
                      r"\s*(?P<tags>.*)$")
# the prefill kernel a row names, after its plan tag: "[wgmma]" (the Hopper kernel) or "[mma.sync]"
_KERNEL_TAG = re.compile(r"\s*\[(wgmma|mma\.sync)\]\s*$")
_WRITE = re.compile(r"^KV write \(reshape_and_cache\) (?P<t>\d+) tokens\s*(?P<tags>.*)$")
_MERGE = re.compile(r"^merge_attn_states (?P<t>\d+)x\d+x\d+\s*(?P<tags>.*)$")


class BenchError(ValueError):
    """The input is not a bench-cuda result this script can read."""


def load_rows(path):
    """The rows of a bench-cuda result: (meta, [row dict]) from --json output or the text table."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise BenchError(f"{path}: not valid JSON ({e}); expected the output of `kvattn bench-cuda --json`")
        rows = doc.get("rows")
        if not isinstance(rows, list):
            raise BenchError(f"{path}: no 'rows' list; expected {{\"rows\": [{{\"name\", \"us\", \"value\", \"unit\"}}]}}")
        for i, r in enumerate(rows):
            for key in ("name", "us", "value"):
                if key not in r:
                    raise BenchError(f"{path}: row {i} has no '{key}' (keys: {sorted(r)})")
        meta = {k: v for k, v in doc.items() if k != "rows"}
        return meta, rows
    rows, meta = [], {}
    for line in text.splitlines():
        m = re.match(r"^kvattn bench-cuda on (?P<dev>.+?) \((?P<sms>\d+) SMs\)", line)
        if m:
            meta = {"device": m.group("dev"), "sms": int(m.group("sms"))}
            continue
        m = _TEXT_ROW.match(line)
        if m:
            rows.append({"name": m.group("name").strip(), "us": float(m.group("us")), "value": float(m.group("value")),
                         "unit": m.group("unit") or "", "target": m.group("target").strip()})
    if not rows:
        raise BenchError(f"{path}: no bench-cuda rows found (neither JSON nor the text table)")
    return meta, rows


def _tag(tags):
    """'kept' for a kept-plan row, 'plain' for an untagged one (the small shapes, which the bench
    runs on their default path only), None for a diagnostic or per-call row.  Parenthesised
    words ("(again)", "(third)": repeats) do not count."""
    t = re.sub(r"\([^)]*\)", "", tags).strip()
    return "kept" if t == "[plan kept]" else "plain" if t == "" else None


def _shape_len(l):
    return l.replace(" ", "")


def classify(rows):
    """Figures by key: ceilings, and per shape the fastest kept-plan row (decode/prefill) or row."""
    out = {"ceilings": {}, "decode": {}, "prefill": {}, "prefill_wgmma": {}, "write": {}, "merge": {}}

    def keep(table, key, row, tag="plain"):
        # a kept-plan row wins over an untagged one; among equals, the fastest (repeats)
        old = table.get(key)
        rank = 1 if tag == "kept" else 0
        if old is None or rank > old["rank"] or (rank == old["rank"] and 0 < row["us"] < old["us"]):
            table[key] = {"us": float(row["us"]), "value": float(row["value"]), "unit": row.get("unit", ""), "rank": rank}

    for r in rows:
        name = r["name"]
        if name.startswith("ceiling: device copy"):
            out["ceilings"]["copy_tbps"] = max(out["ceilings"].get("copy_tbps", 0.0), float(r["value"]))
        elif name.startswith("ceiling: mma.sync"):
            out["ceilings"]["mma_tflops"] = max(out["ceilings"].get("mma_tflops", 0.0), float(r["value"]))
        elif name.startswith("ceiling: wgmma"):
            out["ceilings"]["wgmma_tflops"] = max(out["ceilings"].get("wgmma_tflops", 0.0), float(r["value"]))
        elif (m := _DECODE.match(name)) and _tag(m.group("tags")):
            dt = "bf16" if m.group("dtype") == "bf16" else "fp8"
            keep(out["decode"], f"{dt} {m.group('b')}x{_shape_len(m.group('l'))}", r, _tag(m.group("tags")))
        elif m := _PREFILL.match(name):
            tags, kernel = m.group("tags"), None
            if k := _KERNEL_TAG.search(tags):
                tags, kernel = tags[:k.start()], k.group(1)
            if _tag(tags) != "kept":
                continue
            shape = m.group("l") or f"(q {m.group('lq')}, kv {m.group('lkv')})"
            key = f"{m.group('mask')} {m.group('b')}x{shape}"
            # two series: the mma.sync kernel and the Hopper (wgmma) kernel.  A row naming its
            # kernel wins; an untagged row (the default path: the wgmma kernel where an sm_90a
            # build covers the call, else mma.sync) stands in for the mma.sync series only when
            # the run timed no wgmma row for that shape.
            if kernel == "wgmma":
                keep(out["prefill_wgmma"], key, r, "kept")
            else:
                keep(out["prefill"], key, r, "kept" if kernel is not None else "plain")
        elif (m := _WRITE.match(name)) and _tag(m.group("tags")) == "plain":
            keep(out["write"], m.group("t"), r)
        elif (m := _MERGE.match(name)) and _tag(m.group("tags")) == "plain":
            keep(out["merge"], m.group("t"), r)
    for key in list(out["prefill"]):  # untagged rows stand in for mma.sync only where no wgmma row is
        if out["prefill"][key]["rank"] == 0 and key in out["prefill_wgmma"]:
            del out["prefill"][key]
    return out


def load_anchors(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    for section in ("decode", "prefill"):
        if section not in doc:
            raise BenchError(f"{path}: no '{section}' section in the FlashInfer figures")
    return doc


def _sort_decode(key):
    dt, shape = key.split(" ", 1)
    b, l = shape.split("x", 1)
    lnum = int(re.findall(r"\d+", l)[-1])
    return (dt != "bf16", int(b) * lnum, l.startswith("U"))


def _sort_prefill(key):
    mask, shape = key.split(" ", 1)
    nums = [int(x) for x in re.findall(r"\d+", shape)]
    return (mask != "causal", "(" in shape, nums[0], key)  # by batch: 1x8192, 4x4096, 8x2048, ...


def figures(result, anchors):
    """What the plots and the table show, as plain data (also embedded in each PNG)."""
    fig = classify(result)
    dec, pre = [], []
    for key in sorted(fig["decode"], key=_sort_decode):
        k = fig["decode"][key]
        a = anchors["decode"].get(key, {})
        dec.append({"shape": key, "kvattn_us": k["us"], "kvattn_tbps": k["value"],
                    "flashinfer_us": a.get("us"), "flashinfer_tbps": a.get("tbps")})
    for key in sorted(set(fig["prefill"]) | set(fig["prefill_wgmma"]), key=_sort_prefill):
        k = fig["prefill"].get(key)
        wg = fig["prefill_wgmma"].get(key)
        a = anchors["prefill"].get(key, {})
        pre.append({"shape": key, "kvattn_tflops": k["value"] if k else None,
                    "kvattn_wgmma_tflops": wg["value"] if wg else None,
                    "fa2_tflops": a.get("fa2_tflops"), "fa3_tflops": a.get("fa3_tflops")})
    ratio = []
    for d in dec:
        if d["flashinfer_us"]:
            ratio.append({"case": f"decode {d['shape']}", "speed": d["flashinfer_us"] / d["kvattn_us"]})
    for p in pre:
        if p["fa3_tflops"] and p["kvattn_tflops"]:
            ratio.append({"case": f"prefill {p['shape']}, mma.sync kernel (FA3)", "speed": p["kvattn_tflops"] / p["fa3_tflops"]})
    for p in pre:
        if p["fa3_tflops"] and p["kvattn_wgmma_tflops"]:
            ratio.append({"case": f"prefill {p['shape']}, wgmma kernel (FA3)",
                          "speed": p["kvattn_wgmma_tflops"] / p["fa3_tflops"]})
    for op in ("write", "merge"):
        for key in sorted(fig[op], key=int):
            a = anchors.get(op, {}).get(key, {})
            if a.get("us"):
                label = f"KV write {key} tokens" if op == "write" else f"merge {key}x32x128"
                ratio.append({"case": label, "speed": a["us"] / fig[op][key]["us"]})
    return {"ceilings": fig["ceilings"], "decode": dec, "prefill": pre, "ratio": ratio,
            "hbm_nominal_tbps": anchors.get("hbm_nominal_tbps")}


def _save(plt, f, path, data):
    f.tight_layout()
    f.savefig(path, dpi=110, metadata={"kvattn-data": json.dumps(data, sort_keys=True)})
    plt.close(f)


def plot(data, out_dir, device=""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = []
    suffix = f" ({device})" if device else ""
    width = 0.38

    # decode bandwidth: the shapes large enough to be bandwidth-bound (a microsecond-long call is
    # launch-bound, its TB/s says little), bf16 and fp8
    dec = [d for d in data["decode"] if d["kvattn_us"] >= 50]
    skipped = []
    if not dec:
        skipped.append("decode_bandwidth.png (no decode row of 50 us or more)")
    else:
        written.append(_decode_plot(plt, dec, data, out_dir, suffix, width))
    if not data["prefill"]:
        skipped.append("prefill_tflops.png (no kept-plan prefill row)")
    else:
        written.append(_prefill_plot(plt, data, out_dir, suffix))
    if not data["ratio"]:
        skipped.append("speed_ratio.png (no shape with a FlashInfer figure)")
    else:
        written.append(_ratio_plot(plt, data, out_dir, suffix))
    for s in skipped:
        print(f"plot.py: not written: {s}", file=sys.stderr)
    return written


def _decode_plot(plt, dec, data, out_dir, suffix, width):
    f, ax = plt.subplots(figsize=(9, 4.6))
    xs = list(range(len(dec)))
    ax.bar([x - width / 2 for x in xs], [d["kvattn_tbps"] for d in dec], width, label="kvattn", color="#1f77b4")
    ax.bar([x + width / 2 for x in xs], [d["flashinfer_tbps"] or 0 for d in dec], width,
           label="FlashInfer (tensor-core decode)", color="#ff7f0e")
    copy = data["ceilings"].get("copy_tbps")
    if copy:
        ax.axhline(copy, color="black", linestyle="--", linewidth=1, label=f"device copy, same run ({copy:.2f} TB/s)")
    if data.get("hbm_nominal_tbps"):
        ax.axhline(data["hbm_nominal_tbps"], color="grey", linestyle=":", linewidth=1,
                   label=f"HBM nominal ({data['hbm_nominal_tbps']:.1f} TB/s)")
    ax.set_xticks(xs, [d["shape"].replace(" ", "\n", 1) for d in dec], fontsize=8)
    ax.set_ylabel("K+V read, TB/s")
    ax.set_title("Paged decode bandwidth by batch x kv length" + suffix)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    path = os.path.join(out_dir, "decode_bandwidth.png")
    _save(plt, f, path, {"decode": dec, "copy_tbps": copy})
    return path


def _prefill_plot(plt, data, out_dir, suffix):
    pre = data["prefill"]
    # bars per shape: kvattn's default path, its Hopper (wgmma) kernel when the run timed it,
    # FlashInfer's FA2 and FA3 paged paths
    series = [("kvattn, mma.sync kernel", "kvattn_tflops", "#aec7e8")]
    if any(p["kvattn_wgmma_tflops"] for p in pre):
        series.append(("kvattn, Hopper kernel (wgmma; the default on sm_90a)", "kvattn_wgmma_tflops", "#1f77b4"))
    series += [("FlashInfer FA2 (mma.sync)", "fa2_tflops", "#ffbb78"),
               ("FlashInfer FA3 paged (wgmma)", "fa3_tflops", "#ff7f0e")]
    f, ax = plt.subplots(figsize=(max(8, 1.6 * len(pre)), 4.6))
    xs = list(range(len(pre)))
    w = 0.8 / len(series)
    for i, (label, field, color) in enumerate(series):
        off = (i - (len(series) - 1) / 2) * w
        ax.bar([x + off for x in xs], [p[field] or 0 for p in pre], w, label=label, color=color)
    mma = data["ceilings"].get("mma_tflops")
    if mma:
        ax.axhline(mma, color="black", linestyle="--", linewidth=1, label=f"mma.sync bf16, same run ({mma:.0f} TFLOP/s)")
    wgmma = data["ceilings"].get("wgmma_tflops")
    if wgmma:
        ax.axhline(wgmma, color="grey", linestyle=":", linewidth=1, label=f"wgmma bf16, same run ({wgmma:.0f} TFLOP/s)")
    ax.set_xticks(xs, [p["shape"].replace(" ", "\n", 1) for p in pre], fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("Paged prefill throughput" + suffix)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    path = os.path.join(out_dir, "prefill_tflops.png")
    _save(plt, f, path, {"prefill": pre, "mma_tflops": mma, "wgmma_tflops": wgmma})
    return path


def _ratio_plot(plt, data, out_dir, suffix):
    ratio = data["ratio"]
    f, ax = plt.subplots(figsize=(8, 1.2 + 0.32 * max(len(ratio), 3)))
    ys = list(range(len(ratio)))
    ax.barh(ys, [r["speed"] for r in ratio], color=["#2ca02c" if r["speed"] >= 1 else "#d62728" for r in ratio])
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(ys, [r["case"] for r in ratio], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("kvattn speed / FlashInfer speed (> 1: kvattn faster)")
    ax.set_title("kvattn against FlashInfer, same GPU" + suffix)
    path = os.path.join(out_dir, "speed_ratio.png")
    _save(plt, f, path, {"ratio": ratio})
    return path


def _fmt(x, spec):
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(data):
    lines = ["| shape | kvattn | FlashInfer | kvattn ÷ FlashInfer speed |", "|---|---|---|---|"]
    for d in data["decode"]:
        k = f"{_fmt(d['kvattn_us'], '.1f')} µs" + (f", {d['kvattn_tbps']:.2f} TB/s" if d["kvattn_us"] >= 50 else "")
        fi = "—" if d["flashinfer_us"] is None else (
            f"{d['flashinfer_us']:.1f} µs" + (f", {d['flashinfer_tbps']:.2f} TB/s" if d["flashinfer_tbps"] else ""))
        sp = _fmt(d["flashinfer_us"] / d["kvattn_us"], ".2f") if d["flashinfer_us"] else "—"
        lines.append(f"| decode {d['shape']} | {k} | {fi} | {sp} |")
    for p in data["prefill"]:
        # the default path's ratio, the Hopper kernel's next to it
        sp = "—"
        if p["fa3_tflops"]:
            sp = " / ".join(f"{name}{x / p['fa3_tflops']:.2f}" for name, x in
                            (("mma.sync ", p["kvattn_tflops"]), ("wgmma ", p["kvattn_wgmma_tflops"])) if x) + " of FA3"
        k = " / ".join(f"{name}{x:.0f}" for name, x in (("mma.sync ", p["kvattn_tflops"]), ("wgmma ", p["kvattn_wgmma_tflops"]))
                       if x) + " TFLOP/s"
        lines.append(f"| prefill {p['shape']} | {k} | FA3 paged "
                     f"{_fmt(p['fa3_tflops'], '.0f')}, FA2 {_fmt(p['fa2_tflops'], '.0f')} | {sp} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result", help="output of `kvattn bench-cuda --json` (or its text table)")
    ap.add_argument("--anchors", default=DEFAULT_ANCHORS, help="FlashInfer's figures (default: %(default)s)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="directory for the PNGs (default: docs/img)")
    ap.add_argument("--table", action="store_true", help="also print the side-by-side Markdown table")
    args = ap.parse_args(argv)
    try:
        meta, rows = load_rows(args.result)
        data = figures(rows, load_anchors(args.anchors))
    except (OSError, BenchError) as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    if not data["decode"] and not data["prefill"]:
        print(f"plot.py: {args.result}: no kept-plan decode or prefill rows; run `kvattn bench-cuda` without --only",
              file=sys.stderr)
        return 2
    for p in plot(data, args.out, meta.get("device", "")):
        print(p)
    if args.table:
        print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
