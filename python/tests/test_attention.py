"""Native (FlashInfer-equivalent) backend through Python: metadata build and forward on a mixed
prefill/decode batch over NumPy-owned step tensors and a kvattn-allocated paged cache, against a
dense NumPy softmax attention over each request's unpaged K/V."""
import numpy as np
import pytest

import kvattn

NAME = "model.layers.0.self_attn.attn"
HQ, HKV, D, BS = 4, 2, 64, 16


def dense(q, k, v, scale):
    """q [Lq, HQ, D] at the last Lq positions of k/v [L, HKV, D]; causal.  float64."""
    Lq, L = q.shape[0], k.shape[0]
    out = np.zeros(q.shape, np.float64)
    for i in range(Lq):
        vis = L - Lq + i + 1
        for h in range(HQ):
            s = k[:vis, h // (HQ // HKV)].astype(np.float64) @ q[i, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[:vis, h // (HQ // HKV)].astype(np.float64)
    return out


@pytest.fixture
def setup():
    spec = kvattn.FullAttentionSpec(block_size=BS, num_kv_heads=HKV, head_size=D, dtype="float16")
    cfg = kvattn.get_kv_cache_config({NAME: spec}, "LBNHC", 32 * spec.page_size_bytes, max_model_len=128)
    kv_cache = kvattn.allocate_kv_cache(cfg, "cpu", "LBNHC")[NAME]
    config = kvattn.BackendConfig(num_attention_heads=HQ, num_kv_heads=HKV, head_size=D, max_model_len=128,
                                  max_num_seqs=8, max_num_batched_tokens=64, model_dtype="float16",
                                  kv_cache_layout="LBNHC", num_sms=2)
    backend = kvattn.FlashInferBackend()
    impl = backend.make_impl(config, num_heads=HQ, head_size=D, scale=D ** -0.5, num_kv_heads=HKV)
    impl.process_weights_after_loading("float16")
    layer = kvattn.AttentionLayer(NAME, impl)
    config.register_layer(layer)
    builder = backend.make_builder(spec, [NAME], config)
    return backend, config, impl, layer, builder, kv_cache, cfg.num_blocks


def test_backend_traits(setup):
    backend, config, impl, *_ = setup
    assert backend.get_name() == "FLASHINFER"
    assert not backend.forward_includes_kv_cache_update()
    assert 128 in backend.get_supported_head_sizes()
    assert impl.num_heads == HQ and impl.num_kv_heads == HKV and abs(impl.scale - 0.125) < 1e-12
    assert backend.validate_configuration(config, head_size=128, dtype="float16") == []
    reasons = backend.validate_configuration(config, head_size=48, dtype="float16")
    assert reasons and any("48" in r for r in reasons)


def test_mixed_batch_forward_matches_dense(setup):
    backend, config, impl, layer, builder, kv_cache, num_blocks = setup
    rng = np.random.default_rng(7)
    seq_lens = [20, 33, 40, 9]
    query_lens = [1, 1, 7, 9]  # two decodes, a chunked prefill, a fresh prefill
    n_req = len(seq_lens)
    pool = rng.permutation(np.arange(1, num_blocks)).astype(np.int32)
    bt = np.zeros((n_req, 8), np.int32)
    at = 0
    for r, s in enumerate(seq_lens):
        nb = -(-s // BS)
        bt[r, :nb] = pool[at:at + nb]
        at += nb
    K = [rng.uniform(-1, 1, (s, HKV, D)).astype(np.float16) for s in seq_lens]
    V = [rng.uniform(-1, 1, (s, HKV, D)).astype(np.float16) for s in seq_lens]
    Q = [rng.uniform(-1, 1, (q, HQ, D)).astype(np.float16) for q in query_lens]

    # Context of every request, written through the impl (positions [0, seq - query)).
    for r in range(n_req):
        ctx = seq_lens[r] - query_lens[r]
        if ctx:
            pos = np.arange(ctx, dtype=np.int64)
            slots = kvattn.compute_slot_mapping(np.array([0, ctx], np.int32), pos, bt[r:r + 1], block_size=BS)
            impl.do_kv_cache_update(layer, K[r][:ctx], V[r][:ctx], kv_cache, slots)

    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    T = int(qsl[-1])
    positions = np.concatenate([np.arange(s - q, s) for s, q in zip(seq_lens, query_lens)]).astype(np.int64)
    slot_mapping = kvattn.compute_slot_mapping(qsl, positions, bt, block_size=BS)
    seq = np.array(seq_lens, np.int32)
    cm = kvattn.CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=n_req, num_actual_tokens=T,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens), block_table_tensor=bt,
        slot_mapping=slot_mapping, seq_lens_cpu_upper_bound=seq, positions=positions)
    assert kvattn.split_decodes_and_prefills(cm, builder.reorder_batch_threshold) == (2, 2, 2, 16)

    md = builder.build(0, cm)
    assert isinstance(md, kvattn.FlashInferMetadata)
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens) == (2, 2, 2, 16)
    assert md.decode_path == "native" and md.prefill_path == "native" and not md.use_cascade

    q = np.concatenate(Q)
    k = np.concatenate([K[r][seq_lens[r] - query_lens[r]:] for r in range(n_req)])
    v = np.concatenate([V[r][seq_lens[r] - query_lens[r]:] for r in range(n_req)])
    impl.do_kv_cache_update(layer, k, v, kv_cache, slot_mapping)
    out = np.full((T, HQ, D), 512.0, np.float16)
    ptr = out.ctypes.data
    impl.forward(layer, q, k, v, kv_cache, md, out)
    assert out.ctypes.data == ptr
    for r in range(n_req):
        want = dense(Q[r], K[r], V[r], D ** -0.5)
        got = out[qsl[r]:qsl[r + 1]].astype(np.float64)
        np.testing.assert_allclose(got, want, atol=4e-3, rtol=0)


def test_backend_errors(setup):
    backend, config, *_ = setup
    with pytest.raises((NotImplementedError, ValueError), match="alibi|ALiBi"):
        backend.make_impl(config, num_heads=HQ, head_size=D, scale=0.125, num_kv_heads=HKV, alibi_slopes=[1.0] * HQ)
    with pytest.raises(ValueError, match="attn_type"):
        backend.make_impl(config, num_heads=HQ, head_size=D, scale=0.125, num_kv_heads=HKV, attn_type="x")
    with pytest.raises(ValueError):
        kvattn.BackendConfig(num_attention_heads=0, num_kv_heads=HKV, head_size=D, max_model_len=128,
                             max_num_seqs=8, max_num_batched_tokens=64)


def test_runner_pipeline_reorder_prepare_build_forward(setup):
    """vLLM's runner order: InputBatch (shuffled) -> reorder -> BatchPreparer -> build -> update -> forward."""
    backend, config, impl, layer, builder, kv_cache, num_blocks = setup
    rng = np.random.default_rng(11)
    reqs = {"p": (30, 30), "d1": (25, 1), "c": (40, 6), "d2": (17, 1)}  # id -> (seq_len, query_len)
    pool = iter(rng.permutation(np.arange(1, num_blocks)).tolist())
    blocks = {r: [next(pool) for _ in range(-(-s // BS))] for r, (s, _) in reqs.items()}
    K = {r: rng.uniform(-1, 1, (s, HKV, D)).astype(np.float16) for r, (s, _) in reqs.items()}
    V = {r: rng.uniform(-1, 1, (s, HKV, D)).astype(np.float16) for r, (s, _) in reqs.items()}
    Q = {r: rng.uniform(-1, 1, (q, HQ, D)).astype(np.float16) for r, (_, q) in reqs.items()}
    batch = kvattn.InputBatch(8, 8)
    for r, (s, q) in reqs.items():
        ctx = s - q
        batch.add_request(r, num_prompt_tokens=ctx if q == 1 else s, num_computed_tokens=ctx,
                          num_scheduled_tokens=q, block_ids=blocks[r])
        if ctx:
            bt = np.array([blocks[r]], np.int32)
            slots = kvattn.compute_slot_mapping(np.array([0, ctx], np.int32), np.arange(ctx, dtype=np.int64), bt,
                                                block_size=BS)
            impl.do_kv_cache_update(layer, K[r][:ctx], V[r][:ctx], kv_cache, slots)
    assert kvattn.reorder_batch_to_split_decodes_and_prefills(batch, None, builder.reorder_batch_threshold)
    order = batch.req_ids
    assert set(order[:2]) == {"d1", "d2"} and order[2:] == ["c", "p"]
    prep = kvattn.BatchPreparer(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=128, block_size=BS,
                                num_blocks=num_blocks)
    cm = prep.prepare(batch)
    md = builder.build(0, cm)
    assert (md.num_decodes, md.num_prefills) == (2, 2)
    q = np.concatenate([Q[r] for r in order])
    k = np.concatenate([K[r][reqs[r][0] - reqs[r][1]:] for r in order])
    v = np.concatenate([V[r][reqs[r][0] - reqs[r][1]:] for r in order])
    impl.do_kv_cache_update(layer, k, v, kv_cache, cm.slot_mapping[:cm.num_actual_tokens])
    out = np.zeros(q.shape, np.float16)
    impl.forward(layer, q, k, v, kv_cache, md, out)
    qsl = cm.query_start_loc_cpu
    for i, r in enumerate(order):
        np.testing.assert_allclose(out[qsl[i]:qsl[i + 1]].astype(np.float64), dense(Q[r], K[r], V[r], D ** -0.5),
                                   atol=4e-3, rtol=0)
