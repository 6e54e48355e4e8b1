"""kvattn's helpers called the way vLLM's own code and tests call them: seed signatures and
keyword names, int64 as well as int32 index tensors (vLLM's tests pass ``torch.tensor([...])``,
which is int64), vLLM's private names, and the paged-KV metadata the FlashInfer backend computes.

Each case runs on NumPy arrays always and on PyTorch tensors where PyTorch is importable (the
``torch`` parameter is reported as skipped, with that reason, where it is not)."""
import numpy as np
import pytest

import kvattn

try:
    import torch
except ImportError:
    torch = None

FRAMEWORKS = ["numpy", pytest.param("torch", marks=pytest.mark.skipif(
    torch is None, reason="PyTorch is not installed here; the torch cases run where it is"))]
INT_DTYPES = ["int64", "int32"]


def arr(values, framework, dtype):
    """vLLM-style integer tensor: np.array(..., dtype) or torch.tensor(..., dtype=torch.<dtype>)."""
    if framework == "torch":
        return torch.tensor(values, dtype=getattr(torch, dtype))
    return np.array(values, dtype=dtype)


# ---- split_prefill_chunks(seq_lens_cpu, workspace_size, request_offset=0) -----------------------
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_split_prefill_chunks_any_integer_dtype_and_keywords(framework, dtype):
    seq = arr([10, 20, 30, 40], framework, dtype)
    assert kvattn.split_prefill_chunks(seq, 50) == [(0, 2), (2, 3), (3, 4)]
    assert kvattn.split_prefill_chunks(seq_lens_cpu=seq, workspace_size=50, request_offset=3) == [
        (3, 5), (5, 6), (6, 7)]
    assert kvattn.split_prefill_chunks(seq, 100) == [(0, 4)]
    with pytest.raises(ValueError, match="row 3 has sequence length 40"):
        kvattn.split_prefill_chunks(seq, 39)


def test_split_prefill_chunks_int64_out_of_int32_range_is_refused():
    with pytest.raises(ValueError, match=r"seq_lens_cpu: element 1 = 4294967296 does not fit in int32"):
        kvattn.split_prefill_chunks(np.array([5, 2 ** 32], np.int64), 2 ** 40)


# ---- fill_mm_prefix_query_ranges(out, mm_prefix_range, query_start_loc_cpu, seq_lens_cpu) ---------
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_fill_mm_prefix_query_ranges_any_integer_dtype(framework, dtype):
    # Request 0: 4 query tokens at positions 6..9 (seq_len 10); its range [5, 8] covers 6, 7, 8.
    # Request 1: 2 tokens, no ranges.
    out = np.full((8, 2), 99, np.int32)
    n = kvattn.fill_mm_prefix_query_ranges(
        out=out, mm_prefix_range={0: [(5, 8)]}, query_start_loc_cpu=arr([0, 4, 6], framework, dtype),
        seq_lens_cpu=arr([10, 7], framework, dtype))
    assert n == 6
    np.testing.assert_array_equal(out[:6], [[5, 8], [5, 8], [5, 8], [-1, -1], [-1, -1], [-1, -1]])
    np.testing.assert_array_equal(out[6:], [[99, 99]] * 2)  # past the scheduled tokens: untouched
    assert kvattn.fill_mm_prefix_query_ranges(out, None, arr([0, 4, 6], framework, dtype),
                                              arr([10, 7], framework, dtype)) == 0


# ---- get_dcp_local_seq_lens(seq_lens, dcp_size=1, dcp_rank=None, cp_kv_cache_interleave_size=1) -----
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_get_dcp_local_seq_lens_any_integer_dtype(framework, dtype):
    seq = arr([5, 8], framework, dtype)
    every_rank = kvattn.get_dcp_local_seq_lens(seq, dcp_size=2)
    np.testing.assert_array_equal(np.asarray(every_rank), [[3, 2], [4, 4]])
    rank1 = kvattn.get_dcp_local_seq_lens(seq_lens=seq, dcp_size=2, dcp_rank=1, cp_kv_cache_interleave_size=1)
    np.testing.assert_array_equal(np.asarray(rank1), [2, 4])


# ---- select_common_block_size(kv_manager_block_size, backends, kv_cache_specs=None) -------------------
class _VllmStyleBackend:
    """A vLLM backend class as select_common_block_size sees it (classmethods)."""
    sizes = [kvattn.MultipleOf(16)]

    @classmethod
    def get_name(cls):
        return cls.__name__

    @classmethod
    def get_supported_kernel_block_sizes(cls, kv_cache_spec=None):
        return cls.sizes


class _Strict32(_VllmStyleBackend):
    sizes = [32, 16]


class _SpecSized(_VllmStyleBackend):
    """Sizes that depend on the spec passed in (kv_cache_specs[i])."""

    @classmethod
    def get_supported_kernel_block_sizes(cls, kv_cache_spec=None):
        return [8] if kv_cache_spec is not None and kv_cache_spec.head_size == 256 else [kvattn.MultipleOf(16)]


class _NoSpecArgument:
    def get_name(self):
        return "NO_SPEC"

    def get_supported_kernel_block_sizes(self):
        return [16]


def test_select_common_block_size_seed_signature():
    assert kvattn.select_common_block_size(64, [_VllmStyleBackend]) == 64
    assert kvattn.select_common_block_size(kv_manager_block_size=64, backends=[_VllmStyleBackend, _Strict32]) == 32
    assert kvattn.select_common_block_size(64, [_Strict32, kvattn.BlockSizeBackend("B", [kvattn.MultipleOf(8)])]) == 32
    assert kvattn.select_common_block_size(64, [_NoSpecArgument()]) == 16
    big = kvattn.FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=256, dtype="bfloat16")
    assert kvattn.select_common_block_size(64, [_SpecSized], kv_cache_specs=None) == 64
    assert kvattn.select_common_block_size(64, [_SpecSized], kv_cache_specs=[big]) == 8
    assert kvattn.select_common_block_size(64, [_SpecSized, _VllmStyleBackend], [None, None]) == 64
    with pytest.raises(ValueError, match=r"No common block size for 64 \(A: \[16\]; B: \[32\]\)"):
        kvattn.select_common_block_size(64, [kvattn.BlockSizeBackend("A", [16]), kvattn.BlockSizeBackend("B", [32])])
    with pytest.raises(ValueError, match="1 kv_cache_specs for 2 backends"):
        kvattn.select_common_block_size(64, [_SpecSized, _VllmStyleBackend], [big])
    with pytest.raises(ValueError, match="backend 0 is 'x'"):
        kvattn.select_common_block_size(64, ["x"])


def test_select_common_block_size_earlier_attention_group_form_still_works():
    spec = kvattn.FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=64, dtype="bfloat16")
    g = kvattn.AttentionGroup(kvattn.BlockSizeBackend("STRICT", [32]), ["l0"], spec)
    assert kvattn.select_common_block_size(64, [g]) == 32


# ---- _merge_supported_layouts(supported_layouts_lists) --------------------------------------------
def test_merge_supported_layouts_under_vllm_private_name():
    L = kvattn.KVCacheLayout
    assert kvattn._merge_supported_layouts([[L.LBNHC, L.LBHNC]] * 2) == [L.LBNHC, L.LBHNC]
    assert kvattn._merge_supported_layouts(
        supported_layouts_lists=[[L.LBHNC, L.LBNHC], [L.LBHNC, L.LBNHC], [L.LBNHC, L.LBHNC]]) == [L.LBHNC, L.LBNHC]
    assert kvattn._merge_supported_layouts([[L.LBNHC, L.LBHNC], [L.LBHNC]]) == [L.LBHNC]
    with pytest.raises(ValueError, match="No KV cache layout"):
        kvattn._merge_supported_layouts([[L.LBNHC], [L.LBHNC]])


# ---- XQA masks: (q_len, causal, device) and (q_lens, max_q_len, causal, device) ------------------------
def test_xqa_masks_take_the_seed_device_argument():
    m = kvattn._make_xqa_draft_block_mask(3, True, "cpu")
    np.testing.assert_array_equal(m, [[1, 0], [3, 0], [7, 0]])
    assert m.dtype == np.uint16
    np.testing.assert_array_equal(kvattn._make_xqa_draft_block_mask(q_len=3, causal=False, device=None), [[7, 0]] * 3)
    r = kvattn._make_xqa_ragged_draft_block_mask(q_lens=[2, 1], max_q_len=2, causal=True, device="cpu")
    np.testing.assert_array_equal(r, [[1, 0], [3, 0], [1, 0]])
    r = kvattn._make_xqa_ragged_draft_block_mask(np.array([2, 1], np.int64), 2, False)
    np.testing.assert_array_equal(r, [[3, 0], [3, 0], [1, 0]])
    if torch is None:
        with pytest.raises(NotImplementedError, match="needs PyTorch"):
            kvattn._make_xqa_draft_block_mask(3, True, "cuda:0")


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed here; the torch case runs where it is")
def test_xqa_masks_on_a_torch_device():
    m = kvattn._make_xqa_draft_block_mask(3, True, torch.device("cpu"))
    assert isinstance(m, torch.Tensor) and m.tolist() == [[1, 0], [3, 0], [7, 0]]


# ---- the paged-KV metadata the FlashInfer backend computes ---------------------------------------
def _cm(seq_lens, query_lens, block_table, framework="numpy"):
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    seq = np.asarray(seq_lens, np.int32)
    bt = np.asarray(block_table, np.int32)
    if framework == "torch":
        qsl, seq, bt = torch.from_numpy(qsl), torch.from_numpy(seq), torch.from_numpy(bt)
    n = int(qsl[-1])
    return kvattn.CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=len(seq_lens), num_actual_tokens=n,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens), block_table_tensor=bt,
        slot_mapping=np.full(n, -1, np.int64), seq_lens_cpu_upper_bound=seq)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_paged_kv_metadata_builder(framework):
    bt = [[7, 3, 0, 0], [5, 0, 0, 0], [2, 9, 4, 0]]
    b = kvattn.PagedKVMetadataBuilder(max_num_reqs=4, max_model_len=64, page_size=16, num_blocks=10)
    md = b.build(_cm([20, 9, 33], [1, 9, 5], bt, framework), num_decodes=1)
    assert (md.num_reqs, md.num_actual_pages, md.use_cascade) == (3, 6, False)
    np.testing.assert_array_equal(np.asarray(md.paged_kv_indptr), [0, 2, 3, 6])
    np.testing.assert_array_equal(np.asarray(md.paged_kv_indices), [7, 3, 5, 2, 9, 4])
    np.testing.assert_array_equal(np.asarray(md.paged_kv_last_page_len), [4, 9, 1])
    np.testing.assert_array_equal(np.asarray(md.paged_kv_indptr_cpu), [0, 2, 3, 6])
    if framework == "torch":
        assert isinstance(md.paged_kv_indptr, torch.Tensor)
    else:
        assert isinstance(md.paged_kv_indptr, np.ndarray)

    # Cascade: the first page is shared; each request keeps the pages after it.
    md = b.build(_cm([20, 17, 33], [1, 1, 5], [[7, 3, 0, 0], [7, 5, 0, 0], [7, 9, 4, 0]], framework),
                 num_decodes=2, common_prefix_len=16)
    assert md.use_cascade and md.num_common_kv_blocks == 1
    np.testing.assert_array_equal(np.asarray(md.paged_kv_indptr), [0, 1, 2, 4])
    np.testing.assert_array_equal(np.asarray(md.paged_kv_indices), [3, 5, 9, 4])
    np.testing.assert_array_equal(np.asarray(md.paged_kv_last_page_len), [4, 1, 1])
    np.testing.assert_array_equal(np.asarray(md.shared_kv_page_indices), [7])

    with pytest.raises(ValueError, match="10"):  # block id 10 outside the pool of 10 blocks
        b.build(_cm([20], [20], [[1, 10, 0, 0]], framework))
    with pytest.raises(ValueError, match="multiple of the page size 16"):
        b.build(_cm([20], [1], [[1, 2, 0, 0]], framework), num_decodes=1, common_prefix_len=8)


def test_block_size_is_supported_and_layout_from_name_under_vllm_private_names():
    big = kvattn.FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=256, dtype="bfloat16")
    assert kvattn._block_size_is_supported([_VllmStyleBackend, _Strict32], 32, [None, None])
    assert not kvattn._block_size_is_supported([_VllmStyleBackend, _Strict32], 64, [None, None])
    assert kvattn._block_size_is_supported(backends=[_SpecSized], block_size=8, specs=[big])
    assert not kvattn._block_size_is_supported([_SpecSized], 8, [None])
    with pytest.raises(ValueError, match="1 specs for 2 backends"):
        kvattn._block_size_is_supported([_SpecSized, _Strict32], 16, [None])
    assert kvattn._layout_from_name(layout_name="HND") == kvattn.KVCacheLayout.LBHNC
    assert kvattn._layout_from_name("LBNHC") == kvattn.KVCacheLayout.LBNHC


# ---- the rest of the audit: vLLM's parameter names where kvattn's differed -------------------------
def test_worker_helpers_take_vllm_parameter_names():
    L = kvattn.KVCacheLayout

    class HndFirst:  # vLLM passes backend classes; each answers supported_kv_cache_layouts()
        @staticmethod
        def supported_kv_cache_layouts():
            return [L.LBHNC, L.LBNHC]

    class AnyLayout:
        @staticmethod
        def supported_kv_cache_layouts():
            return None

    assert kvattn.get_supported_kv_cache_layouts(backends=[HndFirst, AnyLayout]) == [L.LBHNC, L.LBNHC]
    assert kvattn.get_supported_kv_cache_layouts([[L.LBNHC], None]) == [L.LBNHC]  # declarations as before

    gib = 1 << 30
    snap = kvattn.MemorySnapshot(total_memory=100 * gib, free_memory=100 * gib, device="cuda:0")

    class CacheConfig:  # vLLM's CacheConfig, the field request_memory reads
        gpu_memory_utilization = 0.5

    assert kvattn.request_memory(snap, CacheConfig(), 0) == 50 * gib
    assert kvattn.request_memory(init_snapshot=snap, cache_config=0.25, external_weight_memory=0) == 25 * gib

    spec = kvattn.FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=64, dtype="bfloat16")
    backend = kvattn.BlockSizeBackend("EXACT", [16, 32])
    custom = kvattn.customize_attention_spec(backend=backend, spec=spec)
    assert custom == kvattn.customize_attention_spec(backend, spec) and custom != spec

    cfg = kvattn.get_kv_cache_config({"model.layers.0.attn": spec}, "LBNHC", 4 * spec.page_size_bytes,
                                     max_model_len=128)
    views = kvattn.allocate_kv_cache(kv_cache_config=cfg, device="cpu", layout=L.LBNHC, kernel_block_sizes=None)
    assert list(views) == ["model.layers.0.attn"]

    class Attention:  # vLLM's Attention binds its own view
        def bind_kv_cache(self, kv_cache):
            self.bound = kv_cache

    ctx = {"model.layers.0.attn": Attention()}
    runner = []
    kvattn.bind_kv_cache(views, ctx, runner, 1, None, {"model.layers.0.attn": "kernel view"})
    assert runner == [views["model.layers.0.attn"]] and ctx["model.layers.0.attn"].bound == "kernel view"


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_mamba_get_block_table_tensor_any_integer_seq_lens(framework, dtype):
    class MambaSpecFields:  # the two fields the helper reads from vLLM's MambaSpec
        block_size = 4
        num_speculative_blocks = 1

    bt = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    if framework == "torch":
        bt = torch.from_numpy(bt)
    out = kvattn.mamba_get_block_table_tensor(bt, arr([5, 9], framework, dtype), MambaSpecFields, "align")
    # row r: block_table[r, (seq_lens[r] - 1) // 4 + j] for j in 0..1
    np.testing.assert_array_equal(np.asarray(out), [[2, 3], [7, 8]])
    assert kvattn.mamba_get_block_table_tensor(bt, arr([5, 9], framework, dtype), MambaSpecFields, "none") is bt
