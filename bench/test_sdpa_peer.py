"""bench/sdpa_peer.py's FLOP count against a key-by-key count of the causal mask, and its shape
list against the prefill shapes `kvattn bench-cuda` prints (no GPU or PyTorch needed)."""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sdpa_peer  # noqa: E402


def brute_pairs(q_len, kv_len, causal):
    ctx = kv_len - q_len
    return sum(1 for i in range(q_len) for j in range(kv_len) if not causal or j <= ctx + i)


def test_visible_pairs_match_the_mask():
    for q_len, kv_len in [(1, 1), (1, 7), (5, 5), (3, 17), (16, 16), (31, 64), (64, 64)]:
        for causal in (True, False):
            assert sdpa_peer.visible_pairs(q_len, kv_len, causal) == brute_pairs(q_len, kv_len, causal)


def test_flops_count_every_query_head():
    # 8 x 2048 causal: 4 * 128 * 32 * 8 * 2048 * 2049 / 2
    assert sdpa_peer.flops(8, 2048, 2048, True) == 4 * 128 * 32 * 8 * 2048 * 2049 // 2
    assert sdpa_peer.flops(1, 512, 4096, True) == 4 * 128 * 32 * (512 * 3584 + 512 * 513 // 2)


def test_shapes_are_the_cuda_bench_kept_plan_shapes():
    # tools/cmd_bench_cuda.cpp lists them as Shape{requests, kv length, query length (-1: = kv), causal, ...}
    src = open(os.path.join(HERE, "..", "tools", "cmd_bench_cuda.cpp")).read()
    bench = set()
    for n, kv, q, causal in re.findall(r"Shape\{(\d+), (\d+), (-?\d+), (true|false)", src):
        kv = int(kv)
        bench.add((int(n), kv if int(q) < 0 else int(q), kv, causal == "true"))
    assert len(bench) == 8
    assert {(n, lq, lk, c) for _, n, lq, lk, c in sdpa_peer.SHAPES} == bench
    for name, n, lq, lk, causal in sdpa_peer.SHAPES:  # named as the bench's rows name them
        shape = f"{n}x{lq}" if lq == lk else f"{n}x(q {lq}, kv {lk})"
        assert name == f"{'causal' if causal else 'non-causal'} bf16 {shape}"


def test_imports_without_torch():
    assert "torch" not in sys.modules
