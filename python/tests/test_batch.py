"""Batch-preparation bindings (vLLM names) on NumPy arrays, against vllm-facts vectors and
brute-force Python oracles."""
import types

import numpy as np
import pytest

import kvattn
from conftest import make_cm


# vllm-facts §6 (tests/v1/attention/test_attention_splitting.py), seq_lens = 10 * (i + 1).
@pytest.mark.parametrize("query_lens,threshold,require_uniform,expected", [
    ([1, 1, 1], 1, False, (3, 0, 3, 0)),
    ([1, 2, 1, 3, 2, 1, 2], 3, False, (7, 0, 12, 0)),
    ([4, 5, 6, 7], 3, False, (0, 4, 0, 22)),
    ([2, 1, 3, 4, 5, 6, 7, 8], 4, False, (4, 4, 10, 26)),
    ([2, 2, 1, 3, 2, 1, 2], 3, True, (2, 5, 4, 9)),
    ([2, 2, 2, 4, 5, 6, 7, 8], 4, True, (3, 5, 6, 30)),
    ([2, 1, 2, 4, 5, 6, 7, 8], 4, True, (1, 7, 2, 33)),
])
def test_split_decodes_and_prefills_vllm_vectors(query_lens, threshold, require_uniform, expected):
    cm = make_cm(query_lens)
    assert kvattn.split_decodes_and_prefills(cm, decode_threshold=threshold,
                                             require_uniform=require_uniform) == expected


def test_split_decodes_and_prefills_cuda_graph_padding():
    # [2, 2, 2, 0] padded to 8 tokens, threshold 3, require_uniform -> every row a decode.
    cm = make_cm([2, 2, 2, 0], num_tokens=8)
    assert kvattn.split_decodes_and_prefills(cm, 3, True) == (4, 0, 8, 0)


def test_split_short_extends_as_prefills_reads_is_prefilling():
    cm = make_cm([1, 1, 1, 5], is_prefilling=[False, True, False, True])
    assert kvattn.split_decodes_and_prefills(cm, 1) == (3, 1, 3, 5)
    # Not treating short extends as decodes: row 1 (still prefilling) ends the decodes.
    assert kvattn.split_decodes_and_prefills(cm, 1, treat_short_extends_as_decodes=False) == (1, 3, 1, 7)


def test_split_decodes_prefills_and_extends_vllm_vector():
    cm = make_cm([1, 2, 4, 5, 6], seq_lens=[10, 11, 20, 5, 6])
    assert kvattn.split_decodes_prefills_and_extends(cm, decode_threshold=3) == (2, 1, 2, 3, 4, 11)


def test_split_prefill_chunks_greedy():
    seq = np.array([3, 4, 2, 5, 1], dtype=np.int32)
    assert kvattn.split_prefill_chunks(seq, 7) == [(0, 2), (2, 4), (4, 5)]
    assert kvattn.split_prefill_chunks(seq, 7, request_offset=10) == [(10, 12), (12, 14), (14, 15)]
    with pytest.raises(ValueError, match="workspace"):
        kvattn.split_prefill_chunks(seq, 4)


def test_uniform_helpers():
    assert kvattn.is_uniform_query_len(4, 8, 2)
    assert not kvattn.is_uniform_query_len(4, 7, 2)
    assert kvattn.get_uniform_decode_token_count(4, 8, 2, True) == 2
    assert kvattn.get_uniform_decode_token_count(4, 8, 2, False) is None


def _dcp_oracle(seq_len, world, rank, interleave):
    return sum(1 for pos in range(seq_len) if (pos // interleave) % world == rank)


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (4, 1), (4, 3), (3, 16), (8, 64)])
def test_get_dcp_local_seq_lens_matches_brute_force(world, interleave, rng):
    seq = rng.integers(0, 700, size=23).astype(np.int32)
    every = kvattn.get_dcp_local_seq_lens(seq, dcp_size=world, cp_kv_cache_interleave_size=interleave)
    assert isinstance(every, np.ndarray) and every.dtype == np.int32 and every.shape == (23, world)
    for rank in range(world):
        want = np.array([_dcp_oracle(int(s), world, rank, interleave) for s in seq], dtype=np.int32)
        np.testing.assert_array_equal(every[:, rank], want)
        one = kvattn.get_dcp_local_seq_lens(seq, world, rank, interleave)
        np.testing.assert_array_equal(one, want)
        as_tensor_rank = kvattn.get_dcp_local_seq_lens(seq, world, np.array([rank], dtype=np.int32), interleave)
        np.testing.assert_array_equal(as_tensor_rank, want)
    np.testing.assert_array_equal(every.sum(axis=1), seq)  # every token lives on exactly one rank


def test_compute_slot_mapping_matches_direct_indexing(rng):
    bs = 4
    bt = rng.permutation(np.arange(1, 33)).astype(np.int32).reshape(4, 8)
    q = [3, 1, 5, 2]
    seq = [7, 20, 5, 30]
    qsl = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
    pos = np.concatenate([np.arange(s - l, s) for l, s in zip(q, seq)]).astype(np.int64)
    got = kvattn.compute_slot_mapping(qsl, pos, bt, block_size=bs, pad_to=16)
    want = []
    for r in range(4):
        for p in range(seq[r] - q[r], seq[r]):
            want.append(bt[r, p // bs] * bs + p % bs)
    np.testing.assert_array_equal(got[:11], want)
    np.testing.assert_array_equal(got[11:], np.full(5, kvattn.PAD_SLOT_ID))
    # DCP: rank 1 of 2 stores positions whose (pos // 1) % 2 == 1; others are PAD.
    got1 = kvattn.compute_slot_mapping(qsl, pos, bt, block_size=bs, dcp_world_size=2, dcp_rank=1)
    assert all((got1[i] == -1) == (pos[i] % 2 == 0) for i in range(11))
    with pytest.raises(ValueError, match="block"):
        kvattn.compute_slot_mapping(qsl, pos + 100, bt, block_size=bs)


# vllm-facts §8 (tests/v1/attention/test_batch_reordering.py): (num_scheduled, num_computed).
@pytest.mark.parametrize("requests,expected", [
    ([(100, 100), (1, 10), (200, 200), (1, 20)], [3, 1, 2, 0]),
    ([(100, 0), (10, 50), (1, 10)], [2, 1, 0]),
    ([(1, 10), (1, 20), (100, 0), (200, 0)], [0, 1, 2, 3]),
])
def test_reorder_batch_to_split_decodes_and_prefills(requests, expected):
    batch = kvattn.InputBatch(max_num_reqs=8, max_num_blocks_per_req=4)
    sched = {}
    for i, (n_sched, n_comp) in enumerate(requests):
        batch.add_request(f"r{i}", num_prompt_tokens=n_comp if n_comp else n_sched, num_computed_tokens=n_comp,
                          block_ids=[i + 1])
        sched[f"r{i}"] = n_sched
    scheduler_output = types.SimpleNamespace(num_scheduled_tokens=sched)  # vLLM's SchedulerOutput field
    moved = kvattn.reorder_batch_to_split_decodes_and_prefills(batch, scheduler_output)
    assert batch.req_ids == [f"r{i}" for i in expected]
    assert moved == (expected != list(range(len(expected))))
    # Rows moved with everything they own: block-table row and counts.
    assert [batch.block_row(r)[0] for r in range(len(expected))] == [i + 1 for i in expected]
    assert batch.num_scheduled_tokens == [requests[i][0] for i in expected]


def test_reorder_four_regions_uses_num_prompt_tokens():
    batch = kvattn.InputBatch(8, 2)
    # prefill, short extend (computed < prompt, 1 token), decode, long extend
    batch.add_request("prefill", 50, 0, 50)
    batch.add_request("short", 40, 10, 1)
    batch.add_request("decode", 5, 9, 1)
    batch.add_request("long", 40, 10, 8)
    kvattn.reorder_batch_to_split_decodes_and_prefills(batch, decode_threshold=1)
    assert batch.req_ids == ["decode", "short", "long", "prefill"]


def test_mm_prefix_ranges_and_query_ranges():
    img = kvattn.MultiModalFeatureSpec("image", kvattn.PlaceholderRange(offset=5, length=4))
    big = kvattn.MultiModalFeatureSpec("video", kvattn.PlaceholderRange(offset=20, length=10))
    audio = kvattn.MultiModalFeatureSpec("audio", kvattn.PlaceholderRange(offset=40, length=3))
    gappy = kvattn.MultiModalFeatureSpec("image", kvattn.PlaceholderRange(2, 5, is_embed=[1, 1, 0, 1, 1]))
    ranges = kvattn.compute_mm_prefix_ranges([[img, big, audio], [], [gappy]])
    assert ranges == {0: [(5, 8), (20, 29)], 2: [(2, 3), (5, 6)]}
    assert kvattn.compute_mm_prefix_ranges([[img, big]], sliding_window=5) == {0: [(5, 8)]}

    t = kvattn.compute_mm_prefix_range_tensor(ranges, 3)
    assert t.shape == (3, 2, 2) and t.dtype == np.int32
    np.testing.assert_array_equal(t[0], [[5, 8], [20, 29]])
    np.testing.assert_array_equal(t[1], [[0, 0], [0, 0]])
    assert kvattn.compute_mm_prefix_range_tensor(None, 3) is None

    # One request, seq_len 10, query 4 -> positions 6..9; range (7, 8).
    out = np.full((8, 2), 99, dtype=np.int32)
    n = kvattn.fill_mm_prefix_query_ranges(out, {0: [(7, 8)]}, np.array([0, 4], np.int32),
                                           np.array([10], np.int32))
    assert n == 4
    np.testing.assert_array_equal(out[:4], [[-1, -1], [7, 8], [7, 8], [-1, -1]])
    np.testing.assert_array_equal(out[4:], 99)  # rows past the tokens untouched
    out2 = np.full((8, 2), 99, dtype=np.int32)
    assert kvattn.fill_mm_prefix_query_ranges(out2, {0: [(0, 3)]}, np.array([0, 4], np.int32),
                                              np.array([10], np.int32)) == 0
    assert (out2 == 99).all()


def test_mamba_get_block_table_tensor():
    bt = np.arange(20, dtype=np.int32).reshape(2, 10)
    spec = kvattn.MambaSpec(block_size=4, shapes=[[2, 3]], dtypes=["float32"], mamba_cache_mode="align",
                            num_speculative_blocks=1)
    seq = np.array([9, 1], dtype=np.int32)
    got = kvattn.mamba_get_block_table_tensor(bt, seq, spec, "align")
    # row 0: start (9-1)//4 = 2 -> [2, 3]; row 1: start 0 -> [10, 11]
    np.testing.assert_array_equal(got, [[2, 3], [10, 11]])
    assert kvattn.mamba_get_block_table_tensor(bt, seq, spec, "none") is bt
    out = np.zeros((2, 2), np.int32)
    kvattn.mamba_align_block_table(out, bt, seq, 4)
    np.testing.assert_array_equal(out, got)


def test_spec_decode_reshapes_are_zero_copy_views():
    q = np.arange(6 * 2 * 8, dtype=np.float32).reshape(6, 2, 8)
    r = kvattn.reshape_query_for_spec_decode(q, 3)
    assert r.shape == (3, 2, 2, 8) and r.ctypes.data == q.ctypes.data
    np.testing.assert_array_equal(r, q.reshape(3, 2, 2, 8))
    back = kvattn.reshape_attn_output_for_spec_decode(r)
    assert back.shape == (6, 2, 8) and back.ctypes.data == q.ctypes.data
    with pytest.raises(ValueError, match="divisible|4"):
        kvattn.reshape_query_for_spec_decode(q, 4)


def test_batch_preparer_builds_metadata():
    batch = kvattn.InputBatch(4, 4)
    batch.add_request("a", 8, 8, 1, block_ids=[3, 5, 7])   # decode at position 8
    batch.add_request("b", 6, 0, 6, block_ids=[2, 4])      # prefill 0..5
    prep = kvattn.BatchPreparer(max_num_reqs=4, max_num_batched_tokens=32, max_model_len=64, block_size=4,
                                num_blocks=16)
    cm = prep.prepare(batch, num_tokens_padded=8)
    np.testing.assert_array_equal(cm.query_start_loc_cpu, [0, 1, 7])
    np.testing.assert_array_equal(cm.seq_lens, [9, 6])
    np.testing.assert_array_equal(cm.positions[:7], [8, 0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(cm.slot_mapping[:7], [7 * 4 + 0, 8, 9, 10, 11, 16, 17])
    assert cm.num_actual_tokens == 7 and cm.max_query_len == 6 and cm.num_reqs == 2 and cm.max_seq_len == 9
    np.testing.assert_array_equal(cm.is_prefilling, [0, 1])
    assert kvattn.split_decodes_and_prefills(cm) == (1, 1, 1, 6)
    cm.validate()
    un = cm.unpadded(7, 1)
    assert un.num_reqs == 1 and un.seq_lens.shape == (1,)
    np.testing.assert_array_equal(cm.naive_query_lens(), [1, 6])


def test_batch_errors_carry_the_cpp_message():
    batch = kvattn.InputBatch(1, 2)
    batch.add_request("a", 4, 0, 4, block_ids=[1])
    with pytest.raises(ValueError, match=r"add_request\(b\): the batch is full .*max_num_reqs"):
        batch.add_request("b", 4, 0, 4)
    with pytest.raises(ValueError, match="2 block ids do not fit a block-table row of 1"):
        kvattn.InputBatch(2, 1).add_request("x", 1, 0, 1, block_ids=[1, 2])
    cm = make_cm([1, 2])
    cm.query_start_loc_cpu = np.array([0, 1, 3], dtype=np.float32)
    with pytest.raises(ValueError, match="int32"):
        kvattn.split_decodes_and_prefills(cm)
    cm2 = make_cm([1, 2])
    cm2.causal = np.array([True, False])
    with pytest.raises(NotImplementedError, match="scalar"):
        kvattn.split_decodes_and_prefills(cm2)


def test_classify_request_regions():
    assert kvattn.classify_request(100, 0, 100) == "prefill"
    assert kvattn.classify_request(8, 10, 40) == "long_extend"
    assert kvattn.classify_request(1, 10, 40) == "short_extend"
    assert kvattn.classify_request(1, 40, 40) == "decode"
