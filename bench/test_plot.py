"""bench/plot.py on a small synthetic `kvattn bench-cuda` result: the PNGs are written, are PNGs,
and the figures embedded in them are the input's (read back from the files)."""
import json
import os
import struct
import subprocess
import sys
import zlib

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plot  # noqa: E402

ROWS = [
    {"name": "ceiling: device copy 2 GiB (read+write)", "us": 0, "value": 4.25, "unit": "TB/s", "target": ""},
    {"name": "ceiling: mma.sync bf16 m16n8k16, registers", "us": 0, "value": 640.0, "unit": "TFLOP/s", "target": ""},
    {"name": "ceiling: wgmma bf16, registers", "us": 0, "value": 900.0, "unit": "TFLOP/s", "target": ""},
    {"name": "decode bf16 1x1024", "us": 9.5, "value": 0.44, "unit": "TB/s", "target": "<= 10 us"},
    {"name": "decode bf16 1x1024 (again)", "us": 9.3, "value": 0.45, "unit": "TB/s", "target": "<= 10 us"},
    {"name": "decode bf16 1x1024 [v8 small]", "us": 8.0, "value": 0.52, "unit": "TB/s", "target": ""},
    {"name": "decode bf16 64x4096 [plan per call]", "us": 260.0, "value": 4.13, "unit": "TB/s", "target": ""},
    {"name": "decode bf16 64x4096", "us": 245.0, "value": 4.38, "unit": "TB/s", "target": ""},
    {"name": "decode bf16 64x4096 [plan kept]", "us": 250.0, "value": 4.29, "unit": "TB/s", "target": ">= 4.4 TB/s"},
    {"name": "decode bf16 64x4096 [plan kept, page path off]", "us": 240.0, "value": 4.47, "unit": "TB/s", "target": ""},
    {"name": "decode bf16 128xU[256,8192] [plan kept]", "us": 500.0, "value": 4.40, "unit": "TB/s", "target": ""},
    {"name": "decode fp8 e4m3 256x8192 [plan kept]", "us": 1100.0, "value": 3.90, "unit": "TB/s", "target": ""},
    {"name": "prefill causal bf16 8x2048 [plan kept]", "us": 1000.0, "value": 310.0, "unit": "TFLOP/s", "target": ""},
    {"name": "prefill causal bf16 8x2048 (again) [plan kept]", "us": 990.0, "value": 312.0, "unit": "TFLOP/s",
     "target": ""},
    {"name": "prefill non-causal bf16 8x2048 [plan kept]", "us": 1800.0, "value": 334.0, "unit": "TFLOP/s", "target": ""},
    # the Hopper kernel's rows: the wgmma kernel and the mma.sync kernel on the same shapes
    {"name": "prefill causal bf16 8x2048 [plan kept] [wgmma]", "us": 700.0, "value": 450.0, "unit": "TFLOP/s",
     "target": "(FA3 paged 465)"},
    {"name": "prefill causal bf16 8x2048 [plan kept] [mma.sync]", "us": 1000.0, "value": 305.0, "unit": "TFLOP/s",
     "target": "(FA3 paged 465)"},
    # the default path's untagged row on a shape with a wgmma row and no mma.sync row (an older
    # binary's table on an H200): the wgmma kernel served it, so it is no mma.sync figure
    {"name": "prefill causal bf16 1x8192 [plan kept]", "us": 1060.0, "value": 519.0, "unit": "TFLOP/s", "target": ""},
    {"name": "prefill causal bf16 1x8192 [plan kept] [wgmma]", "us": 1055.0, "value": 521.0, "unit": "TFLOP/s",
     "target": "(FA3 paged 517)"},
    {"name": "prefill causal bf16 8x(q 512, kv 4096) [plan kept] [wgmma]", "us": 500.0, "value": 520.0,
     "unit": "TFLOP/s", "target": "(FA3 paged 538)"},
    {"name": "prefill causal bf16 8x(q 512, kv 4096) [plan kept] [mma.sync]", "us": 800.0, "value": 321.0,
     "unit": "TFLOP/s", "target": "(FA3 paged 538)"},
    {"name": "KV write (reshape_and_cache) 16384 tokens", "us": 40.0, "value": 3.4, "unit": "TB/s", "target": ""},
    {"name": "merge_attn_states 8192x32x128", "us": 51.6, "value": 3.9, "unit": "TB/s", "target": ""},
]

ANCHORS = {
    "hbm_nominal_tbps": 4.8,
    "decode": {"bf16 1x1024": {"us": 13.3, "tbps": 0.31}, "bf16 64x4096": {"us": 255.0, "tbps": 4.2},
               "fp8 256x8192": {"us": 1650.0, "tbps": 2.6}},
    "prefill": {"causal 8x2048": {"fa2_tflops": 300, "fa3_tflops": 465},
                "causal 8x(q 512, kv 4096)": {"fa2_tflops": 320, "fa3_tflops": 538}},
    "write": {"16384": {"us": 40.0}},
    "merge": {"8192": {"us": 51.6}},
}


def png_text_chunks(path):
    """The tEXt chunks of a PNG file, checking its signature and chunk CRCs on the way."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, chunks, width, height = 8, {}, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in chunk {kind}"
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            chunks[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
        if kind == b"IEND":
            break
    assert width > 200 and height > 100, f"{path}: {width}x{height}"
    return chunks


def embedded(path):
    return json.loads(png_text_chunks(path)["kvattn-data"])


@pytest.fixture
def inputs(tmp_path):
    result = tmp_path / "bench.json"
    result.write_text(json.dumps({"device": "Test GPU", "sms": 132, "rows": ROWS}))
    anchors = tmp_path / "anchors.json"
    anchors.write_text(json.dumps(ANCHORS))
    return result, anchors, tmp_path / "img"


def test_plots_written_and_figures_read_back(inputs):
    result, anchors, out = inputs
    assert plot.main([str(result), "--anchors", str(anchors), "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["decode_bandwidth.png", "prefill_tflops.png", "speed_ratio.png"]

    dec = embedded(out / "decode_bandwidth.png")
    assert dec["copy_tbps"] == 4.25
    # a kept-plan row over an untagged one, diagnostics ([plan per call], [page path off]) ignored;
    # 1x1024 (launch-bound) left out of the bandwidth plot; shapes by size
    assert [d["shape"] for d in dec["decode"]] == ["bf16 64x4096", "bf16 128xU[256,8192]", "fp8 256x8192"]
    d64 = dec["decode"][0]
    assert (d64["kvattn_us"], d64["kvattn_tbps"], d64["flashinfer_us"], d64["flashinfer_tbps"]) == (250.0, 4.29, 255.0, 4.2)
    assert dec["decode"][1]["flashinfer_tbps"] is None  # no anchor for this shape: shown empty, not invented

    pre = embedded(out / "prefill_tflops.png")
    assert (pre["mma_tflops"], pre["wgmma_tflops"]) == (640.0, 900.0)
    # the mma.sync series: a row naming the kernel wins over the untagged default path's rows
    # (which stand in only for a shape with neither such row nor a wgmma row: non-causal); the
    # wgmma kernel's rows beside it
    assert pre["prefill"] == [
        {"shape": "causal 1x8192", "kvattn_tflops": None, "kvattn_wgmma_tflops": 521.0, "fa2_tflops": None,
         "fa3_tflops": None},
        {"shape": "causal 8x2048", "kvattn_tflops": 305.0, "kvattn_wgmma_tflops": 450.0, "fa2_tflops": 300,
         "fa3_tflops": 465},
        {"shape": "causal 8x(q 512, kv 4096)", "kvattn_tflops": 321.0, "kvattn_wgmma_tflops": 520.0,
         "fa2_tflops": 320, "fa3_tflops": 538},
        {"shape": "non-causal 8x2048", "kvattn_tflops": 334.0, "kvattn_wgmma_tflops": None, "fa2_tflops": None,
         "fa3_tflops": None},
    ]

    ratio = {r["case"]: r["speed"] for r in embedded(out / "speed_ratio.png")["ratio"]}
    assert ratio == pytest.approx({
        "decode bf16 1x1024": 13.3 / 9.3,  # the fastest untagged repeat, not the [v8 small] row
        "decode bf16 64x4096": 255.0 / 250.0,
        "decode fp8 256x8192": 1650.0 / 1100.0,
        "prefill causal 8x2048, mma.sync kernel (FA3)": 305.0 / 465,
        "prefill causal 8x(q 512, kv 4096), mma.sync kernel (FA3)": 321.0 / 538,
        "prefill causal 8x2048, wgmma kernel (FA3)": 450.0 / 465,
        "prefill causal 8x(q 512, kv 4096), wgmma kernel (FA3)": 520.0 / 538,
        "KV write 16384 tokens": 1.0,
        "merge 8192x32x128": 1.0,
    })


def test_text_table_input_gives_the_same_figures(inputs, tmp_path):
    result, anchors, _ = inputs
    # the plain table `kvattn bench-cuda` prints (print_row's format), ceilings and unit-less rows included
    lines = ["kvattn bench-cuda on Test GPU (132 SMs)",
             f"{'case':<44} {'median':>13} {'rate':>9} {'unit':<8} target"]
    for r in ROWS + [{"name": "ceiling: empty launch, 1 CTA", "us": 4.7, "value": 0, "unit": "", "target": "(launch floor)"}]:
        lines.append(f"{r['name']:<44} {r['us']:>10.1f} us {r['value']:>9.3f} {r['unit']:<8} {r['target']}")
    text = tmp_path / "bench.txt"
    text.write_text("\n".join(lines) + "\n")
    meta_j, rows_j = plot.load_rows(str(result))
    meta_t, rows_t = plot.load_rows(str(text))
    assert meta_t == {"device": "Test GPU", "sms": 132} and meta_j["device"] == "Test GPU"
    assert len(rows_t) == len(ROWS) + 1
    assert rows_t[5] == ROWS[5] == {"name": "decode bf16 1x1024 [v8 small]", "us": 8.0, "value": 0.52, "unit": "TB/s",
                                    "target": ""}
    assert rows_t[-1] == {"name": "ceiling: empty launch, 1 CTA", "us": 4.7, "value": 0.0, "unit": "",
                          "target": "(launch floor)"}
    a = plot.load_anchors(str(anchors))
    assert plot.figures(rows_t, a) == plot.figures(rows_j, a)


def test_markdown_table(inputs):
    result, anchors, _ = inputs
    data = plot.figures(plot.load_rows(str(result))[1], plot.load_anchors(str(anchors)))
    t = plot.table(data).splitlines()
    assert t[0].startswith("| shape | kvattn | FlashInfer |")
    assert "| decode bf16 64x4096 | 250.0 µs, 4.29 TB/s | 255.0 µs, 4.20 TB/s | 1.02 |" in t
    assert "| decode bf16 1x1024 | 9.3 µs | 13.3 µs, 0.31 TB/s | 1.43 |" in t
    assert "| prefill causal 8x2048 | mma.sync 305 / wgmma 450 TFLOP/s | FA3 paged 465, FA2 300 | mma.sync 0.66 / wgmma 0.97 of FA3 |" in t
    assert "| prefill non-causal 8x2048 | mma.sync 334 TFLOP/s | FA3 paged —, FA2 — | — |" in t


def test_bad_inputs_are_refused_with_the_reason(tmp_path, capsys):
    no_rows = tmp_path / "x.json"
    no_rows.write_text('{"device": "GPU"}')
    assert plot.main([str(no_rows), "--out", str(tmp_path / "o")]) == 2
    assert "no 'rows' list" in capsys.readouterr().err
    missing = tmp_path / "y.json"
    missing.write_text(json.dumps({"rows": [{"name": "decode bf16 1x1024", "us": 9.5}]}))
    assert plot.main([str(missing)]) == 2
    assert "row 0 has no 'value'" in capsys.readouterr().err
    only_write = tmp_path / "z.json"
    only_write.write_text(json.dumps({"rows": [r for r in ROWS if r["name"].startswith("KV write")]}))
    assert plot.main([str(only_write), "--out", str(tmp_path / "o")]) == 2
    assert "no kept-plan decode or prefill rows" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_default_anchors_file_covers_the_bench_target_shapes():
    a = plot.load_anchors(plot.DEFAULT_ANCHORS)
    for key in ("bf16 1x1024", "bf16 1x8192", "bf16 16x4096", "bf16 64x4096", "bf16 128x4096",
                "bf16 128xU[256,8192]", "bf16 256x8192", "fp8 256x8192"):
        assert a["decode"][key]["us"] > 0, key
    for key in ("causal 8x2048", "causal 1x8192", "non-causal 8x2048"):
        assert a["prefill"][key]["fa3_tflops"] > a["prefill"][key]["fa2_tflops"] > 0, key


def test_command_line(inputs):
    result, anchors, out = inputs
    p = subprocess.run([sys.executable, os.path.join(HERE, "plot.py"), str(result), "--anchors", str(anchors),
                        "--out", str(out), "--table"], capture_output=True, text=True, check=True)
    assert str(out / "decode_bandwidth.png") in p.stdout
    assert "| decode bf16 64x4096 |" in p.stdout


def test_a_result_without_prefill_writes_the_other_plots_and_says_so(inputs, capsys):
    result, anchors, out = inputs
    result.write_text(json.dumps({"rows": [r for r in ROWS if not r["name"].startswith("prefill")]}))
    assert plot.main([str(result), "--anchors", str(anchors), "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["decode_bandwidth.png", "speed_ratio.png"]
    assert "not written: prefill_tflops.png (no kept-plan prefill row)" in capsys.readouterr().err
    assert [r["case"] for r in embedded(out / "speed_ratio.png")["ratio"]][:3] == [
        "decode bf16 1x1024", "decode bf16 64x4096", "decode fp8 256x8192"]
