"""KV-memory bindings: layouts and their resolution, specs, the memory plan, allocation and
per-layer views (zero-copy into NumPy), kernel blocks, zeroing and worker helpers."""
import numpy as np
import pytest

import kvattn
from kvattn import KVCacheLayout as L


def test_layout_names_properties_and_errors():
    assert kvattn.layout_from_name("NHD") == L.LBNHC
    assert kvattn.layout_from_name("HND") == L.LBHNC
    assert L.LBNHC.stride_order == (0, 1, 3, 2, 4)
    assert L.BLHNC.is_block_outermost and not L.LBNHC.is_block_outermost
    assert L.LBHNC.is_layer_compact and L.LBHNC.is_block_contiguous
    assert kvattn.get_flashinfer_layout_string(L.LBHNC) == "HND"
    assert kvattn.get_flashinfer_layout_string(L.BLNHC) == "NHD"
    with pytest.raises(NotImplementedError, match="LHBNC"):
        kvattn.get_flashinfer_layout_string(L.LHBNC)
    with pytest.raises(ValueError, match="LBNHC"):
        kvattn.layout_from_name("XYZ")


def test_resolve_and_record_kv_cache_layout():
    cfg = kvattn.CacheConfig()
    with pytest.raises(ValueError):
        cfg.get_resolved_kv_cache_layout()
    got = kvattn.resolve_kv_cache_layout(cfg, [["LBNHC", "LBHNC"], ["LBHNC", "BLHNC"]])
    assert got == L.LBHNC and cfg.kv_cache_layout == L.LBHNC
    kvattn.record_kv_cache_layout(cfg, "HND")  # same layout through its alias: fine
    with pytest.raises(ValueError, match="already resolved"):
        kvattn.record_kv_cache_layout(cfg, "LBNHC")

    class VllmConfig:  # resolve_kv_cache_layout takes vllm_config like vLLM
        cache_config = kvattn.CacheConfig()

    vc = VllmConfig()
    assert kvattn.resolve_kv_cache_layout(vc, [["LBNHC", "LBHNC"]], requested_layout="HND") == L.LBHNC
    with pytest.raises(ValueError, match="No KV cache layout"):
        kvattn.resolve_kv_cache_layout(kvattn.CacheConfig(), [["LBNHC"], ["LBHNC"]])
    assert kvattn.merge_supported_layouts([[L.LBNHC, L.LBHNC], [L.LBHNC, L.LBNHC], [L.LBHNC]]) == [L.LBHNC]


def test_spec_page_sizes_and_vllm_keywords():
    full = kvattn.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=np.float16)
    assert isinstance(full, kvattn.FullAttentionSpec) and isinstance(full, kvattn.KVCacheSpec)
    assert full.kind == "full_attention" and full.dtype == "float16"
    assert full.page_size_bytes == 2 * 16 * (8 + 8) * 2
    assert full.max_memory_usage_bytes(max_model_len=100) == 7 * 1024  # cdiv(100, 16) pages
    mla = kvattn.MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="torch.bfloat16")
    assert mla.head_size_v == 0 and mla.page_size_bytes == 16 * 576 * 2
    sw = kvattn.SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="float16", sliding_window=32)
    assert sw.sliding_window == 32
    # (cdiv(min(32 - 1 + 64, 1000), 16) + 1) pages
    assert sw.max_memory_usage_bytes(max_model_len=1000, max_num_batched_tokens=64) == (6 + 1) * 1024
    mamba = kvattn.MambaSpec(block_size=16, shapes=[[3, 4], [2, 2]], dtypes=["float32", np.float32])
    assert mamba.page_size_bytes == (12 + 4) * 4 and not mamba.has_layer_views
    assert full == kvattn.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="float16")
    assert full != sw
    assert kvattn.KVCacheSpec.merge([full, full]) == full
    with pytest.raises(ValueError, match="sliding_window"):
        kvattn.SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="float16")
    with pytest.raises(ValueError, match="dtype"):
        kvattn.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="float64")
    with pytest.raises(ValueError, match="num_kv_heads"):
        kvattn.FullAttentionSpec(block_size=16, num_kv_heads=0, head_size=8, dtype="float16")


def _two_layer_plan(num_blocks=10, layout=L.LBNHC):
    spec = kvattn.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="float16")
    specs = {"model.layers.0.attn": spec, "model.layers.1.attn": spec}
    cfg = kvattn.get_kv_cache_config(specs, layout, num_blocks * 2 * 1024, max_model_len=64)
    return spec, cfg


def test_memory_plan_and_allocation_views_share_one_buffer():
    spec, cfg = _two_layer_plan()
    assert cfg.num_blocks == 10
    assert len(cfg.kv_cache_groups) == 1 and cfg.kv_cache_groups[0].layer_names == ["model.layers.0.attn",
                                                                                    "model.layers.1.attn"]
    t = cfg.kv_cache_tensors[0]
    assert t.size == 10 * 2048 and t.layers == t.shared_by
    assert kvattn.get_kv_cache_bytes_per_block(cfg.kv_cache_groups, "LBNHC") == 2048
    views = kvattn.allocate_kv_cache(cfg, "cpu", L.LBNHC)
    v0, v1 = views["model.layers.0.attn"], views["model.layers.1.attn"]
    assert v0.shape == (10, 2, 16, 16) and v0.dtype == "float16"
    assert v0.strides == (512, 16, 32, 1)  # LBNHC: physical [B, N, H, C]
    assert abs(v1.data_ptr() - v0.data_ptr()) == t.layer_stride
    assert t.layer_stride == 10 * 1024
    # Writable zero-copy NumPy views; writing through kvattn lands in the same memory.
    a0 = np.asarray(v0)
    assert a0.ctypes.data == v0.data_ptr() and a0.flags.writeable and (a0 == 0).all()
    k, v = kvattn.split_kv_cache_layer_view(v0, 8)
    key = np.random.default_rng(0).standard_normal((3, 2, 8)).astype(np.float16)
    kvattn.reshape_and_cache_flash(key, -key, k, v, np.array([0, 17, 159], np.int64))
    np.testing.assert_array_equal(a0[1, :, 1, :8], key[1])   # slot 17 = block 1, offset 1; K half
    np.testing.assert_array_equal(a0[9, :, 15, 8:], -key[2])  # slot 159 = block 9, offset 15; V half
    with pytest.raises(MemoryError, match="max_model_len"):  # does not fit: OutOfMemory
        kvattn.get_kv_cache_config({"a.0": spec}, L.LBNHC, 1024, max_model_len=4096)


def test_layout_strides_and_shape_helpers():
    spec = kvattn.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="float16")
    assert kvattn.compute_layer_kv_cache_shape_bytes(spec, 10) == (10, 2, 16, 32)
    assert kvattn.compute_layer_kv_cache_shape_bytes(spec, 10, kernel_block_size=8) == (20, 2, 8, 32)
    # LBHNC (identity): C=32 bytes, N: 32*16, H: 16*32*... packed innermost outwards.
    assert kvattn.compute_layout_strides(spec, 10, 2, "LBHNC") == (10 * 1024, 1024, 512, 32, 1)


def test_attention_group_kernel_block_mapping_upstream_vector():
    backend = kvattn.BlockSizeBackend("FLASHINFER", [16, 32, kvattn.MultipleOf(16)])
    spec = kvattn.FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=64, dtype="bfloat16")
    g = kvattn.AttentionGroup(backend, ["model.layers.0.attn"], spec)
    assert kvattn.select_common_block_size(64, [g]) == 64  # MultipleOf(16) accepts 64
    strict = kvattn.AttentionGroup(kvattn.BlockSizeBackend("X", [16, 32]), ["l.0"], spec)
    assert kvattn.select_common_block_size(64, [strict]) == 32
    with pytest.raises(ValueError, match="No common block size"):
        kvattn.select_common_block_size(64, [kvattn.BlockSizeBackend("A", [16]), kvattn.BlockSizeBackend("B", [32])])
    g.configure_kernel_blocks(16, num_ubatches=2, max_num_reqs=4, block_table_width=8)
    assert g.kernel_block_size == 16 and g.blocks_per_kv_block() == 4
    out = g.map_to_kernel_block_table(np.array([[0, 2]], np.int32))
    np.testing.assert_array_equal(np.asarray(out), [[0, 1, 2, 3, 8, 9, 10, 11]])
    with pytest.raises(ValueError):
        g.map_to_kernel_block_table(np.zeros((5, 2), np.int32))  # 5 rows > max_num_reqs


def test_kv_block_zeroer_zeroes_only_requested_blocks():
    spec, cfg = _two_layer_plan()
    views = kvattn.allocate_kv_cache(cfg, "cpu", L.LBNHC)
    arrays = {n: np.asarray(v) for n, v in views.items()}
    for a in arrays.values():
        a[...] = 1.5
    group = kvattn.AttentionGroup(kvattn.BlockSizeBackend("NATIVE"), list(views), spec)
    zeroer = kvattn.KVBlockZeroer("cpu", [group], [16], views, cfg.num_blocks)
    assert len(zeroer.segments["addrs"]) >= 1
    zeroer.zero_block_ids(np.array([3, 7], np.int32))
    for a in arrays.values():
        assert (a[[3, 7]] == 0).all()
        assert (a[[0, 1, 2, 4, 5, 6, 8, 9]] == 1.5).all()
    with pytest.raises(ValueError):
        zeroer.zero_block_ids([10])


def test_bind_kv_cache_orders_by_layer_index_and_binds():
    class Attn:
        kv_cache = None

    ctx = {f"model.layers.{i}.attn": Attn() for i in range(3)}
    caches = {"model.layers.2.attn": np.zeros(2), "model.layers.0.attn": np.ones(2), "model.layers.1.attn": np.full(2, 7.0)}
    runner = []
    kvattn.bind_kv_cache(caches, ctx, runner)
    assert [r[0] for r in runner] == [1.0, 7.0, 0.0]
    assert all(ctx[n].kv_cache is caches[n] for n in caches)
    with pytest.raises(ValueError, match="layer index|integer"):
        kvattn.bind_kv_cache({"lm_head": np.zeros(1)}, {"lm_head": Attn()}, [])
    assert kvattn.extract_layer_index("model.layers.12.self_attn.attn") == 12


def test_kv_sharing_and_request_memory():
    spec = kvattn.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="float16")
    groups = kvattn.get_kv_cache_groups({"model.layers.0.attn": spec, "model.layers.1.attn": spec})
    runner_only = set()
    kvattn.add_kv_sharing_layers_to_kv_cache_groups({"model.layers.2.attn": "model.layers.0.attn"}, groups,
                                                    runner_only)
    assert groups[0].layer_names[-1] == "model.layers.2.attn" and runner_only == {"model.layers.2.attn"}
    gib = 1 << 30
    snap = kvattn.MemorySnapshot(total_memory=100 * gib, free_memory=80 * gib)
    assert kvattn.request_memory(snap, 0.5) == 50 * gib
    with pytest.raises(ValueError, match="GiB"):
        kvattn.request_memory(kvattn.MemorySnapshot(total_memory=100 * gib, free_memory=10 * gib), 0.5)


def test_plan_kv_cache_llama3_8b():
    plan = kvattn.plan_kv_cache("llama3-8b", gpu_memory="8GiB")
    assert plan.block_size == 16
    per_layer_page = 8 * 16 * (128 + 128) * 2  # kv heads * tokens * (K + V) * bf16
    assert plan.bytes_per_block == 32 * per_layer_page
    assert plan.num_blocks == (8 << 30) // plan.bytes_per_block
    assert len(plan.kv_cache_spec) == 32
    with pytest.raises(ValueError, match="llama3-8b"):
        kvattn.plan_kv_cache("no-such-model-xyz", gpu_memory=1 << 30)


def test_estimate_max_model_len_and_uniform_specs():
    a = kvattn.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="float16")
    b = kvattn.FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=8, dtype="float16")
    groups = kvattn.get_kv_cache_groups({"m.0.attn": a, "m.1.attn": b})
    assert len(groups) == 1 and isinstance(groups[0].kv_cache_spec, kvattn.UniformTypeKVCacheSpecs)
    assert groups[0].kv_cache_spec.page_size_bytes == a.page_size_bytes + b.page_size_bytes
    assert kvattn.iter_layer_specs(groups[0].kv_cache_spec) == [a, b]
    per_block = a.page_size_bytes + b.page_size_bytes  # 3072 bytes, LBNHC (layer-outer)
    # 1 null block + cdiv(len, 16) blocks must fit in 11 blocks -> 160 tokens.
    assert kvattn.estimate_max_model_len(groups, "LBNHC", 11 * per_block, max_model_len=1000) == 160


def test_kv_cache_dtype_names_are_vllms_everywhere():
    names = ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4"]
    assert kvattn.kv_cache_dtype_choices() == names
    for n in names:
        t = kvattn.parse_kv_cache_dtype(n)
        assert kvattn.kv_cache_dtype_name(t) == n and t == getattr(kvattn.KVCacheDType, n)
    assert kvattn.kv_cache_storage_dtype("fp8", "bfloat16") == "fp8_e4m3"
    assert kvattn.kv_cache_storage_dtype(kvattn.KVCacheDType.auto, "float16") == "float16"
    for bad in ["bf16", "half", "float32", "FP8"]:
        with pytest.raises(ValueError, match="auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, nvfp4"):
            kvattn.parse_kv_cache_dtype(bad)
    # The planner takes a member or its name and reports the member.
    plan = kvattn.plan_kv_cache("tiny-llama", gpu_memory="64MiB", kv_cache_dtype="fp8")
    assert plan.kv_cache_dtype == kvattn.KVCacheDType.fp8 and plan.kv_dtype == "fp8_e4m3"
    plan = kvattn.plan_kv_cache("tiny-llama", gpu_memory="64MiB", kv_cache_dtype=kvattn.KVCacheDType.fp8_e5m2)
    assert plan.kv_dtype == "fp8_e5m2"
    with pytest.raises(ValueError, match="half"):
        kvattn.plan_kv_cache("tiny-llama", gpu_memory="64MiB", kv_cache_dtype="half")
