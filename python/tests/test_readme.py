"""The README's Python example, run exactly as written (extracted from README.md, so the two
cannot drift), and its result checked against dense causal attention in float64."""
import contextlib
import io
import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- python-example: run by python/tests/test_readme.py -->"


def readme_example() -> str:
    text = README.read_text()
    assert text.count(MARKER) == 1, f"README.md must hold exactly one '{MARKER}'"
    m = re.search(re.escape(MARKER) + r"\n```python\n(.*?)\n```", text, re.S)
    assert m, "the README's marker must be followed by a ```python block"
    return m.group(1)


def dense_causal(q, k, v, scale, group):
    """q [L, HQ, D], k/v [L, HKV, D] of one fresh prefill; float64."""
    L, HQ, _ = q.shape
    out = np.zeros(q.shape, np.float64)
    for i in range(L):
        for h in range(HQ):
            kh, vh = k[: i + 1, h // group].astype(np.float64), v[: i + 1, h // group].astype(np.float64)
            s = kh @ q[i, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ vh
    return out


def test_readme_python_example_runs_and_attends():
    code = readme_example()
    ns = {"__name__": "readme_example"}
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        exec(compile(code, str(README) + ":python-example", "exec"), ns)

    md, out, q, k, v = ns["metadata"], ns["out"], ns["q"], ns["k"], ns["v"]
    assert (md.num_decodes, md.num_prefills, md.num_prefill_tokens) == (0, 2, 29)
    assert md.prefill_path == "native"
    assert stdout.getvalue().startswith("2 native [")
    qsl, D, HQ, HKV = ns["query_start_loc"], ns["D"], ns["HQ"], ns["HKV"]
    assert out.shape == (29, HQ, D) and np.isfinite(out).all()
    for r in range(2):
        rows = slice(qsl[r], qsl[r + 1])
        want = dense_causal(q[rows], k[rows], v[rows], D ** -0.5, HQ // HKV)
        np.testing.assert_allclose(out[rows].astype(np.float64), want, atol=4e-3, rtol=0)

    # The K/V write landed in the pages the block table names: token t of request 0 sits in
    # block_table[0, t // BS] at offset t % BS (LBNHC: [block, head, token, K|V bytes]).
    kv_cache, BS, bt = ns["kv_cache"], ns["BS"], ns["block_table"]
    import kvattn
    k_cache, v_cache = kvattn.split_kv_cache_layer_view(kv_cache, D)
    kc, vc = np.asarray(k_cache), np.asarray(v_cache)
    for t in (0, 17, 19):
        np.testing.assert_array_equal(kc[bt[0, t // BS], t % BS], k[t])
        np.testing.assert_array_equal(vc[bt[0, t // BS], t % BS], v[t])
    np.testing.assert_array_equal(kc[bt[1, 0], 8], k[20 + 8])
