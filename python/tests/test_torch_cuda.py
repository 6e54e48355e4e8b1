"""kvattn's native attention backend on PyTorch-owned CUDA tensors, against PyTorch SDPA (a GPU test:
skipped, with the reason, where PyTorch, a CUDA GPU or a CUDA build of kvattn is missing).

For a mixed batch (decodes, a chunked prefill, fresh prefills) each case
  1. allocates the paged KV cache with PyTorch (an LBNHC cache: physical [B, N, H, 2D], handed to
     kvattn as the logical [B, H, N, 2D] view) and poisons it with random values;
  2. writes every request's context K/V, then this step's K/V, through
     FlashInferImpl.do_kv_cache_update (reshape_and_cache_flash on the GPU);
  3. plans the step with FlashInferMetadataBuilder.build and runs FlashInferImpl.forward;
  4. runs kvattn.paged_attention (the op) on the same cache as a second check;
  5. gathers each request's dense K/V back from the pages (it must equal what was written) and
     compares with torch.nn.functional.scaled_dot_product_attention (float32, bottom-right causal
     mask: query row i of a request sees keys j <= seq_len - q_len + i).
Every tensor kvattn touches is a zero-copy DLPack view of PyTorch memory.

    cmake --preset cuda-release && cmake --build build/cuda-release --target _kvattn
    PYTHONPATH=build/cuda-release/python /usr/bin/python3 -m pytest -v python/tests/test_torch_cuda.py
"""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (a GPU check of kvattn on torch tensors)")
import torch.nn.functional as F  # noqa: E402

import kvattn  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to PyTorch", allow_module_level=True)
if not kvattn.built_with_cuda():
    pytest.skip("kvattn was built without CUDA (cmake --preset cuda-release)", allow_module_level=True)

NAME = "model.layers.0.self_attn.attn"
TOLERANCE = {"bfloat16": 2.5e-2, "float16": 4e-3}


def make_batch(seq_lens, query_lens, block_size, num_blocks, gen):
    """Block table [R, W] int32 of distinct random pages (page 0 = null block, never used)."""
    pool = torch.randperm(num_blocks - 1, generator=gen) + 1
    width = max(-(-s // block_size) for s in seq_lens)
    bt = torch.zeros((len(seq_lens), width), dtype=torch.int32)
    at = 0
    for r, s in enumerate(seq_lens):
        nb = -(-s // block_size)
        bt[r, :nb] = pool[at:at + nb].to(torch.int32)
        at += nb
    return bt


def run_case(dtype_name, capability, HQ=32, HKV=8, D=128, BS=16, seed=0):
    """One mixed batch: (decode/prefill paths, the split, max |backend - sdpa|,
    max |paged_attention - sdpa|, cache round trip exact, backend output finite)."""
    dev = torch.device("cuda", 0)
    dtype = getattr(torch, dtype_name)
    # vLLM's order: 3 decodes | a chunked prefill (45 new tokens after 255 cached) | fresh
    # prefills, the last one a single token (a prefill by position in the batch, not by size).
    seq_lens = [1037, 517, 64, 300, 128, 77, 1]
    query_lens = [1, 1, 1, 45, 128, 77, 1]
    R = len(seq_lens)
    num_blocks = sum(-(-s // BS) for s in seq_lens) + 64
    gen = torch.Generator().manual_seed(seed)

    spec = kvattn.FullAttentionSpec(block_size=BS, num_kv_heads=HKV, head_size=D, dtype=dtype_name)
    config = kvattn.BackendConfig(
        device="cuda:0", capability=capability, model_dtype=dtype_name, num_attention_heads=HQ, num_kv_heads=HKV,
        head_size=D, max_model_len=4096, max_num_seqs=64, max_num_batched_tokens=2048, kv_cache_layout="LBNHC",
        num_sms=torch.cuda.get_device_properties(dev).multi_processor_count)
    backend = kvattn.FlashInferBackend()
    scale = D ** -0.5
    impl = backend.make_impl(config, num_heads=HQ, head_size=D, scale=scale, num_kv_heads=HKV)
    impl.process_weights_after_loading(dtype_name)
    layer = kvattn.AttentionLayer(NAME, impl, device="cuda:0")
    config.register_layer(layer)
    builder = backend.make_builder(spec, [NAME], config)

    # ---- the paged cache, owned by PyTorch -------------------------------------------------
    physical = torch.randn((num_blocks, BS, HKV, 2 * D), generator=gen).to(dtype).to(dev)  # poison
    kv_cache = physical.permute(0, 2, 1, 3)  # logical [B, H, N, 2D] with LBNHC strides
    assert kvattn.from_dlpack(kv_cache).data_ptr() == kv_cache.data_ptr(), "DLPack import copied"

    bt_cpu = make_batch(seq_lens, query_lens, BS, num_blocks, gen)
    K = [torch.empty((s, HKV, D)).uniform_(-1, 1, generator=gen).to(dtype) for s in seq_lens]
    V = [torch.empty((s, HKV, D)).uniform_(-1, 1, generator=gen).to(dtype) for s in seq_lens]
    Q = [torch.empty((q, HQ, D)).uniform_(-1, 1, generator=gen).to(dtype) for q in query_lens]

    # ---- context K/V, written by the impl -------------------------------------------------
    ctx = [s - q for s, q in zip(seq_lens, query_lens)]
    qsl_ctx = torch.zeros(R + 1, dtype=torch.int32)
    qsl_ctx[1:] = torch.cumsum(torch.tensor(ctx), 0)
    pos_ctx = torch.cat([torch.arange(c, dtype=torch.int64) for c in ctx])
    slots_ctx = kvattn.compute_slot_mapping(qsl_ctx, pos_ctx, bt_cpu, block_size=BS)  # torch CPU int64
    k_ctx = torch.cat([K[r][:ctx[r]] for r in range(R)]).to(dev)
    v_ctx = torch.cat([V[r][:ctx[r]] for r in range(R)]).to(dev)
    torch.cuda.synchronize()
    impl.do_kv_cache_update(layer, k_ctx, v_ctx, kv_cache, slots_ctx.to(dev))

    # ---- this step's metadata ------------------------------------------------------------
    qsl_cpu = torch.zeros(R + 1, dtype=torch.int32)
    qsl_cpu[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    T = int(qsl_cpu[-1])
    positions = torch.cat([torch.arange(c, s, dtype=torch.int64) for c, s in zip(ctx, seq_lens)])
    slots = kvattn.compute_slot_mapping(qsl_cpu, positions, bt_cpu, block_size=BS)
    seq_cpu = torch.tensor(seq_lens, dtype=torch.int32)
    cm = kvattn.CommonAttentionMetadata(
        query_start_loc=qsl_cpu.to(dev), query_start_loc_cpu=qsl_cpu, seq_lens=seq_cpu.to(dev), num_reqs=R,
        num_actual_tokens=T, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        block_table_tensor=bt_cpu.to(dev), slot_mapping=slots.to(dev), seq_lens_cpu_upper_bound=seq_cpu,
        positions=positions.to(dev))
    threshold = builder.reorder_batch_threshold or 1
    split = kvattn.split_decodes_and_prefills(cm, threshold)
    md = builder.build(0, cm)
    path = f"decode={md.decode_path} prefill={md.prefill_path} (decodes={md.num_decodes}, prefills={md.num_prefills})"

    q = torch.cat(Q).to(dev)
    k_new = torch.cat([K[r][ctx[r]:] for r in range(R)]).to(dev)
    v_new = torch.cat([V[r][ctx[r]:] for r in range(R)]).to(dev)
    impl.do_kv_cache_update(layer, k_new, v_new, kv_cache, slots.to(dev))
    out = torch.full((T, HQ, D), 512.0, dtype=dtype, device=dev)
    impl.forward(layer, q, k_new, v_new, kv_cache, md, out)
    torch.cuda.synchronize()

    # ---- the op on the same cache (block-table form) ---------------------------------------
    k_view, v_view = kvattn.split_kv_cache_layer_view(kv_cache, D)  # torch views of the cache
    assert k_view.data_ptr() == kv_cache.data_ptr()
    out_op = torch.full((T, HQ, D), 512.0, dtype=dtype, device=dev)
    kvattn.paged_attention(q, k_view, v_view, qsl_cpu.to(dev), out=out_op, block_table=bt_cpu.to(dev),
                           seq_lens=seq_cpu.to(dev), sm_scale=scale)
    torch.cuda.synchronize()

    # ---- reference: dense K/V gathered from the pages, SDPA in float32 -------------------------
    err_backend = err_op = 0.0
    cache_ok = True
    for r in range(R):
        nb = -(-seq_lens[r] // BS)
        pages = bt_cpu[r, :nb].to(dev).long()
        dense = kv_cache[pages].permute(0, 2, 1, 3).reshape(nb * BS, HKV, 2 * D)[:seq_lens[r]]
        kd, vd = dense[..., :D], dense[..., D:]
        if not (torch.equal(kd.cpu(), K[r]) and torch.equal(vd.cpu(), V[r])):
            cache_ok = False
        ql, sl = query_lens[r], seq_lens[r]
        group = HQ // HKV
        qh = Q[r].to(dev).float().transpose(0, 1).unsqueeze(0)                      # [1, HQ, ql, D]
        kh = kd.float().repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)  # [1, HQ, sl, D]
        vh = vd.float().repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
        mask = (torch.arange(sl, device=dev)[None, :] <= (sl - ql + torch.arange(ql, device=dev))[:, None])
        ref = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        ref = ref.squeeze(0).transpose(0, 1)                                         # [ql, HQ, D]
        rows = slice(int(qsl_cpu[r]), int(qsl_cpu[r + 1]))
        err_backend = max(err_backend, (out[rows].float() - ref).abs().max().item())
        err_op = max(err_op, (out_op[rows].float() - ref).abs().max().item())

    return path, split, err_backend, err_op, cache_ok, bool(torch.isfinite(out).all())


@pytest.mark.parametrize("dtype_name,arch_dispatch", [("bfloat16", True), ("float16", True), ("bfloat16", False)],
                         ids=["bf16-arch-dispatch", "f16-arch-dispatch", "bf16-flashinfer-native-paths"])
def test_backend_and_op_match_sdpa_on_torch_tensors(dtype_name, arch_dispatch):
    # arch_dispatch False: no capability given, so no arch-specific kernel family is chosen
    capability = torch.cuda.get_device_capability(0) if arch_dispatch else None
    path, split, err_backend, err_op, cache_ok, finite = run_case(dtype_name, capability)
    tol = TOLERANCE[dtype_name]
    assert cache_ok, "K/V read back from the pages differ from what do_kv_cache_update wrote"
    assert finite, f"non-finite values in the backend output ({path})"
    assert err_backend <= tol, f"max |backend - sdpa| = {err_backend:.3e} > {tol:.1e} ({path}, split={split})"
    assert err_op <= tol, f"max |paged_attention - sdpa| = {err_op:.3e} > {tol:.1e} ({path})"
