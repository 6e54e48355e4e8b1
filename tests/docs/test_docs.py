"""The documentation agrees with the code: links and paths it names exist, every KVATTN_*
environment variable the code reads is documented in CONTRIBUTING.md (and no other), and the
Python guide's example runs and computes attention correctly."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
DOCS = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CONTRIBUTING.md")] + sorted(
    os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
# the PNGs bench/plot.py writes into docs/img (generated from a GPU run, so they may be absent)
PLOT_OUTPUTS = {"decode_bandwidth.png", "prefill_tflops.png", "speed_ratio.png"}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def git_files(*paths):
    out = subprocess.run(["git", "-C", ROOT, "ls-files", *paths], capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (a source tarball): walk the tree instead
        found = []
        for p in paths:
            for d, _, files in os.walk(os.path.join(ROOT, p)):
                found += [os.path.relpath(os.path.join(d, f), ROOT) for f in files]
        return found
    return out.stdout.split()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(doc):
    bad = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", read(doc)):
        if re.match(r"[a-z]+://", target):
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
        if os.path.basename(path) in PLOT_OUTPUTS and os.path.dirname(path) == os.path.join(ROOT, "docs", "img"):
            continue  # a plot of bench/plot.py (test_plot.py checks they are written)
        if not os.path.exists(path):
            bad.append(target)
    assert not bad, f"{os.path.relpath(doc, ROOT)} links to missing files: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_named_scripts_and_sources_exist(doc):
    named = set(re.findall(r"`((?:scripts|bench|tools|examples|python/tests|tests|src|include)/[\w./-]+\.(?:sh|py|cpp|h|md|json))`",
                           read(doc)))
    missing = sorted(p for p in named if "<" not in p and not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, f"{os.path.relpath(doc, ROOT)} names files that do not exist: {missing}"


def test_every_environment_knob_is_documented_in_contributing():
    # quoted names: getenv / knob arguments in the C++ and CUDA sources, os.environ keys in setup.py
    sources = [f for f in git_files("src", "tools", "python/src", "include") if f.endswith((".cpp", ".cu", ".h", ".cuh"))]
    read_by_code = set()
    for f in sources + ["setup.py"]:
        read_by_code |= set(re.findall(r'"(KVATTN_[A-Z0-9_]+)"', read(os.path.join(ROOT, f))))
    documented = set(re.findall(r"^\| `(KVATTN_[A-Z0-9_]+)`", read(os.path.join(ROOT, "CONTRIBUTING.md")), re.M))
    assert "KVATTN_LOG_LEVEL" in read_by_code, read_by_code  # the scan found the knobs
    missing = sorted(read_by_code - documented)
    assert not missing, f"read by the code but not in CONTRIBUTING.md's knob table (add a row): {missing}"
    stale = sorted(documented - read_by_code)
    assert not stale, f"in CONTRIBUTING.md's knob table but read nowhere (remove the row): {stale}"


def test_python_guide_example_runs_and_matches_dense_attention():
    kvattn = pytest.importorskip("kvattn", reason="the kvattn Python module is not built (python3-dev, pybind11-dev)")
    blocks = re.findall(r"```python\n(.*?)```", read(os.path.join(ROOT, "docs", "python-api.md")), re.S)
    assert blocks, "docs/python-api.md has no python example"
    env = {"__name__": "__doc_example__"}
    exec(compile(blocks[0], "docs/python-api.md", "exec"), env)  # noqa: S102 - our own documentation
    out, query, key, value = env["out"], env["query"], env["key"], env["value"]
    # dense attention of the one query token over the 40 written tokens (GQA: 4 query heads, 2 KV heads)
    q = query.astype(np.float64)[0]
    k, v = key.astype(np.float64), value.astype(np.float64)
    want = np.empty((4, 64))
    for h in range(4):
        s = k[:, h // 2] @ q[h] / np.sqrt(64)
        p = np.exp(s - s.max())
        want[h] = p @ v[:, h // 2] / p.sum()
    np.testing.assert_allclose(out[0], want, rtol=2e-3, atol=2e-3)
    # what the example wrote is in the cache the plan allocated
    k_cache = np.asarray(env["k_cache"])
    np.testing.assert_array_equal(k_cache[2, 0], key[16])  # token 16 = block 2 (the second), offset 0
    assert isinstance(env["config"], kvattn.KVCacheConfig)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
