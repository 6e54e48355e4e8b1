"""Ops bindings on NumPy arrays, against NumPy oracles: paged_attention vs dense softmax
attention over gathered pages, reshape_and_cache_flash vs direct indexing, merge_attn_states
vs the LSE formulas.  Outputs are the caller's arrays, written in place (zero copies)."""
import numpy as np
import pytest

import kvattn


def dense_attention(q, k_cache, v_cache, qo_indptr, pages_per_req, kv_lens, causal=True, sm_scale=None,
                    window_left=-1):
    """NumPy oracle: gather each request's K/V from its pages, then softmax(q k^T) v per head.
    Returns (out [T, Hq, D], lse2 [T, Hq] base-2)."""
    T, Hq, D = q.shape
    P, Hkv = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / np.sqrt(D) if sm_scale is None else sm_scale
    out = np.zeros((T, Hq, D), np.float64)
    lse = np.full((T, Hq), -np.inf)
    for r, pages in enumerate(pages_per_req):
        kv_len = kv_lens[r]
        idx = np.arange(kv_len)
        K = k_cache[np.asarray(pages)[idx // P], idx % P].astype(np.float64)  # [kv_len, Hkv, D]
        V = v_cache[np.asarray(pages)[idx // P], idx % P].astype(np.float64)
        q0, q1 = qo_indptr[r], qo_indptr[r + 1]
        for i, t in enumerate(range(q0, q1)):
            qpos = kv_len - (q1 - q0) + i
            vis = np.ones(kv_len, bool)
            if causal:
                vis &= idx <= qpos
            if window_left >= 0:
                vis &= idx >= qpos - window_left
            for h in range(Hq):
                kh = h // (Hq // Hkv)
                s = K[vis, kh] @ q[t, h].astype(np.float64) * scale
                if s.size == 0:
                    continue
                m = s.max()
                p = np.exp(s - m)
                out[t, h] = (p / p.sum()) @ V[vis, kh]
                lse[t, h] = (m + np.log(p.sum())) / np.log(2.0)
    return out, lse


def make_paged_problem(rng, q_lens, kv_lens, page_size=4, hq=4, hkv=2, d=16, num_pages=40):
    k_cache = rng.standard_normal((num_pages, page_size, hkv, d)).astype(np.float32)
    v_cache = rng.standard_normal((num_pages, page_size, hkv, d)).astype(np.float32)
    perm = rng.permutation(np.arange(1, num_pages))  # page 0 = null block, never used
    pages, at = [], 0
    for kv in kv_lens:
        n = -(-kv // page_size)
        pages.append(perm[at:at + n].tolist())
        at += n
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qo[-1]), hq, d)).astype(np.float32)
    return q, k_cache, v_cache, qo, pages


def test_paged_attention_block_table_form_matches_dense(rng):
    # Mixed batch: two decodes, a chunked prefill (query after context), a fresh prefill.
    q_lens, kv_lens = [1, 1, 5, 7], [9, 17, 12, 7]
    q, kc, vc, qo, pages = make_paged_problem(rng, q_lens, kv_lens)
    bt = np.zeros((4, 6), np.int32)
    for r, p in enumerate(pages):
        bt[r, :len(p)] = p
    out = np.full_like(q, np.nan)
    lse = np.full(q.shape[:2], np.nan, np.float32)
    ptr = out.ctypes.data
    kvattn.paged_attention(q, kc, vc, qo, out=out, block_table=bt, seq_lens=np.array(kv_lens, np.int32), lse=lse)
    want, want_lse = dense_attention(q, kc, vc, qo, pages, kv_lens)
    assert out.ctypes.data == ptr  # written in place
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_paged_attention_with_a_kept_plan_over_layers(rng):
    # Two "layers" (own caches, own query) of one step over the same batch with one plan: same
    # results as the oracle.  On CPU arrays the plan is not used (the CPU kernels plan inline).
    q_lens, kv_lens = [1, 2, 1], [11, 6, 3]
    plan = kvattn.PagedAttentionPlan()
    for layer in range(2):
        q, kc, vc, qo, pages = make_paged_problem(rng, q_lens, kv_lens)
        bt = np.zeros((3, 4), np.int32)
        for r, p in enumerate(pages):
            bt[r, :len(p)] = p
        out = np.full_like(q, np.nan)
        kvattn.paged_attention(q, kc, vc, qo, out=out, block_table=bt, seq_lens=np.array(kv_lens, np.int32),
                               plan=plan, kv_lengths="mixed")
        want, _ = dense_attention(q, kc, vc, qo, pages, kv_lens)
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    assert (plan.plans, plan.reuses) == (0, 0)
    plan.invalidate()
    with pytest.raises(Exception, match="kv_lengths must be"):
        kvattn.paged_attention(q, kc, vc, qo, out=out, block_table=bt, seq_lens=np.array(kv_lens, np.int32),
                               kv_lengths="ragged")
    # max_query_len: a promise about the longest query (2 here), checked on CPU arrays
    kvattn.paged_attention(q, kc, vc, qo, out=out, block_table=bt, seq_lens=np.array(kv_lens, np.int32),
                           max_query_len=2)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    with pytest.raises(Exception, match="request 1 has 2 query rows but max_query_len = 1"):
        kvattn.paged_attention(q, kc, vc, qo, out=out, block_table=bt, seq_lens=np.array(kv_lens, np.int32),
                               max_query_len=1)


def test_paged_attention_flashinfer_form_hnd_cache_and_window(rng):
    q_lens, kv_lens = [1, 3, 6], [13, 10, 6]
    q, kc, vc, qo, pages = make_paged_problem(rng, q_lens, kv_lens, page_size=8, hq=8, hkv=2, d=32)
    # HND storage [pages, heads, page_size, D]; the op takes the NHD-ordered strided view.
    kc_hnd = np.ascontiguousarray(kc.transpose(0, 2, 1, 3))
    vc_hnd = np.ascontiguousarray(vc.transpose(0, 2, 1, 3))
    indptr = np.concatenate([[0], np.cumsum([len(p) for p in pages])]).astype(np.int32)
    indices = np.concatenate(pages).astype(np.int32)
    last = np.array([(kv - 1) % 8 + 1 for kv in kv_lens], np.int32)
    out = np.zeros_like(q)
    kvattn.paged_attention(q, kc_hnd.transpose(0, 2, 1, 3), vc_hnd.transpose(0, 2, 1, 3), qo, out=out,
                           paged_kv_indptr=indptr, paged_kv_indices=indices, paged_kv_last_page_len=last,
                           window_left=3, sm_scale=0.1)
    want, _ = dense_attention(q, kc, vc, qo, pages, kv_lens, window_left=3, sm_scale=0.1)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_cascade_attention_equals_attention_over_all_pages(rng):
    page = 4
    q_lens, own = [1, 2, 3], [5, 6, 3]
    shared_pages = [7, 3]
    q, kc, vc, qo, _ = make_paged_problem(rng, q_lens, [1, 1, 1], page_size=page)
    own_pages = [[10, 11], [12, 13], [14]]
    kv_lens = [len(shared_pages) * page + n for n in own]
    full_pages = [shared_pages + p for p in own_pages]
    indptr = np.array([0, 2, 4, 5], np.int32)
    indices = np.array(sum(own_pages, []), np.int32)
    last = np.array([(n - 1) % page + 1 for n in own], np.int32)
    out = np.zeros_like(q)
    kvattn.cascade_attention(q, kc, vc, qo, np.array(shared_pages, np.int32), indptr, indices, last, out=out)
    want, _ = dense_attention(q, kc, vc, qo, full_pages, kv_lens)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_reshape_and_cache_flash_matches_direct_indexing(rng):
    T, H, D, B, bs = 10, 2, 8, 6, 4
    key = rng.standard_normal((T, H, D)).astype(np.float32)
    value = rng.standard_normal((T, H, D)).astype(np.float32)
    kc = rng.standard_normal((B, bs, H, D)).astype(np.float32)  # poison: never zeros
    vc = rng.standard_normal((B, bs, H, D)).astype(np.float32)
    slots = rng.choice(B * bs, size=T, replace=False).astype(np.int64)
    slots[3] = -1  # padding token: skipped
    want_k, want_v = kc.copy(), vc.copy()
    for t, s in enumerate(slots):
        if s >= 0:
            want_k[s // bs, s % bs] = key[t]
            want_v[s // bs, s % bs] = value[t]
    kvattn.reshape_and_cache_flash(key, value, kc, vc, slots, "auto", None, None)
    np.testing.assert_array_equal(kc, want_k)
    np.testing.assert_array_equal(vc, want_v)


def test_reshape_and_cache_flash_hnd_view_and_fp8(rng):
    T, H, D, B, bs = 5, 2, 8, 4, 4
    key = rng.standard_normal((T, H, D)).astype(np.float32)
    value = rng.standard_normal((T, H, D)).astype(np.float32)
    slots = np.array([0, 5, 6, 11, 15], np.int64)
    hnd = np.zeros((B, H, bs, D), np.float32)
    vhnd = np.zeros((B, H, bs, D), np.float32)
    kvattn.reshape_and_cache_flash(key, value, hnd.transpose(0, 2, 1, 3), vhnd.transpose(0, 2, 1, 3), slots)
    for t, s in enumerate(slots):
        np.testing.assert_array_equal(hnd[s // bs, :, s % bs], key[t])
        np.testing.assert_array_equal(vhnd[s // bs, :, s % bs], value[t])
    # fp8 e4m3 through a uint8 cache with a per-tensor scale: decoded value ~ key / scale.
    k8 = np.zeros((B, bs, H, D), np.uint8)
    v8 = np.zeros((B, bs, H, D), np.uint8)
    kvattn.reshape_and_cache_flash(key, value, k8, v8, slots, "fp8", 0.5, 0.25)
    dec = np.asarray(kvattn.from_dlpack(k8).view_as_dtype("fp8_e4m3").to_dtype("float32"))
    for t, s in enumerate(slots):
        np.testing.assert_allclose(dec[s // bs, s % bs], key[t] / 0.5, rtol=1 / 8, atol=1e-2)


def _merge_oracle(po, pl, so, sl):
    pl = np.where(np.isposinf(pl), -np.inf, pl)
    sl = np.where(np.isposinf(sl), -np.inf, sl)
    m = np.maximum(pl, sl)
    ep, es = np.exp(pl - m), np.exp(sl - m)
    tot = ep + es
    a = (ep / tot).T[:, :, None]
    b = (es / tot).T[:, :, None]
    return a * po + b * so, np.log(tot) + m


def test_merge_attn_states_matches_numpy(rng):
    T, H, D = 9, 3, 16
    po = rng.standard_normal((T, H, D)).astype(np.float32)
    so = rng.standard_normal((T, H, D)).astype(np.float32)
    pl = rng.standard_normal((H, T)).astype(np.float32) * 3
    sl = rng.standard_normal((H, T)).astype(np.float32) * 3
    pl[1, 2] = np.inf  # FA2's empty-sequence convention: read as -inf
    out = np.full_like(po, np.nan)
    out_lse = np.full_like(pl, np.nan)
    kvattn.merge_attn_states(out, po, pl, so, sl, out_lse)
    want, want_lse = _merge_oracle(po, pl, so, sl)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out_lse, want_lse, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[2, 1], so[2, 1], rtol=1e-6)  # prefix empty -> suffix only
    # Tokens >= prefill_tokens_with_context take the suffix unchanged.
    out2 = np.zeros_like(po)
    kvattn.merge_attn_states(out2, po, pl, so, sl, prefill_tokens_with_context=4)
    np.testing.assert_allclose(out2[:4], want[:4], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out2[4:], so[4:])


def test_mask_empty_context_lse_vllm_vector():
    lse = np.zeros((2, 134), np.float32)
    kvattn.mask_empty_context_lse(lse, np.array([0, 2, 133, 134], np.int32), np.array([0, 4, 4, 7], np.int32))
    assert np.isneginf(lse[:, 2:133]).all()
    assert (lse[:, :2] == 0).all() and (lse[:, 133:] == 0).all()


def test_lse_helpers_and_page_utils():
    lse = np.array([[1.0, 2.0]], np.float32)
    kvattn.log2_lse_to_ln(lse)
    np.testing.assert_allclose(lse, [[np.log(2), 2 * np.log(2)]], rtol=1e-6)
    bt = np.array([[5, 6, 7], [8, 9, 0]], np.int32)
    indptr = np.array([0, 3, 5], np.int32)
    idx = np.full(5, -1, np.int32)
    kvattn.copy_page_indices(idx, bt, indptr)
    np.testing.assert_array_equal(idx, [5, 6, 7, 8, 9])
    mask = kvattn.make_xqa_draft_block_mask([2, 3], True)
    np.testing.assert_array_equal(mask[:, 0], [0b1, 0b11, 0b1, 0b11, 0b111])
    np.testing.assert_array_equal(kvattn.make_mock_block_table(2, 3), [[1, 2, 3], [4, 5, 6]])


def test_split_kv_cache_layer_view_is_zero_copy():
    B, H, N, D = 3, 2, 4, 8
    layer = np.arange(B * H * N * 2 * D, dtype=np.float32).reshape(B, H, N, 2 * D)
    k, v = kvattn.split_kv_cache_layer_view(layer, D)
    assert k.shape == (B, N, H, D) and v.shape == (B, N, H, D)
    assert k.ctypes.data == layer.ctypes.data
    assert v.ctypes.data == layer.ctypes.data + D * 4
    np.testing.assert_array_equal(k, layer.transpose(0, 2, 1, 3)[..., :D])
    np.testing.assert_array_equal(v, layer.transpose(0, 2, 1, 3)[..., D:])


def test_op_errors_carry_the_cpp_message(rng):
    q, kc, vc, qo, pages = make_paged_problem(rng, [1], [4])
    out = np.zeros_like(q)
    with pytest.raises(ValueError, match="block_table|paged_kv"):
        kvattn.paged_attention(q, kc, vc, qo, out=out)  # no page description
    bad_q = np.zeros((1, 4, 6), np.float32)
    with pytest.raises((NotImplementedError, ValueError), match="head"):
        kvattn.paged_attention(bad_q, kc[..., :6], vc[..., :6], qo, out=np.zeros_like(bad_q),
                               block_table=np.array([pages[0]], np.int32), seq_lens=np.array([4], np.int32))
    key = np.zeros((2, 2, 16), np.float32)
    with pytest.raises(ValueError, match="slot"):
        kvattn.reshape_and_cache_flash(key, key, kc, vc, np.array([0, 10**6], np.int64))
    with pytest.raises(ValueError, match="kv_cache_dtype|auto"):
        kvattn.reshape_and_cache_flash(key, key, kc, vc, np.array([0, 1], np.int64), "int3")
    with pytest.raises(ValueError, match="lse_base"):
        kvattn.paged_attention(q, kc, vc, qo, out=out, lse_base="10", block_table=np.array([pages[0]], np.int32),
                               seq_lens=np.array([4], np.int32))
    if not kvattn.built_with_cuda():
        with pytest.raises(NotImplementedError, match="CUDA"):
            kvattn.zeros([2], "float32", "cuda")
