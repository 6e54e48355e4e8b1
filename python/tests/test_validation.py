"""Python entry points refuse bad counts, ids and lengths up front with a clear ValueError, as
the C++ API does (negative scheduled tokens, duplicate request ids, negative batch counts, a
sequence shorter than its query)."""
import numpy as np
import pytest

import kvattn
from conftest import make_cm


def test_input_batch_refuses_negative_counts_and_duplicate_ids():
    b = kvattn.InputBatch(4, 4)
    with pytest.raises(ValueError, match=r"add_request\(a\): counts must be >= 0.*num_scheduled_tokens = -3"):
        b.add_request("a", 10, 0, -3)
    assert b.num_reqs == 0
    b.add_request("x", 10, 0, 2)
    b.add_request("y", 10, 0, 3)
    with pytest.raises(ValueError, match=r"add_request\(x\): the batch already holds this request id at row 0"):
        b.add_request("x", 5, 0, 1)
    assert b.req_ids == ["x", "y"]
    with pytest.raises(ValueError, match=r"num_scheduled_tokens\[1\] = -1 \(request y\) must be >= 0"):
        b.num_scheduled_tokens = [4, -1]
    assert b.num_scheduled_tokens == [2, 3]  # unchanged
    with pytest.raises(ValueError, match=r"num_scheduled_tokens\['y'\] = -4 must be >= 0"):
        kvattn.reorder_batch_to_split_decodes_and_prefills(b, {"x": 1, "y": -4})
    with pytest.raises(ValueError, match="no num_scheduled_tokens entry for request 'y'"):
        kvattn.reorder_batch_to_split_decodes_and_prefills(b, {"x": 1})
    assert b.num_scheduled_tokens == [2, 3]
    b.remove_request(0)
    assert b.add_request("x", 5, 0, 1) == 1  # a removed id may come back


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 1, 5]])  # fast path (all decodes) and the scan
def test_splits_refuse_negative_counts(query_lens):
    cm = make_cm(query_lens)
    for fn in (kvattn.split_decodes_and_prefills, kvattn.split_decodes_prefills_and_extends):
        with pytest.raises(ValueError, match=r"num_reqs = -5 and num_actual_tokens = \d+ must be >= 0"):
            fn(cm.replace(num_reqs=-5))
        with pytest.raises(ValueError, match=r"num_actual_tokens = -1 must be >= 0"):
            fn(cm.replace(num_actual_tokens=-1))
    assert kvattn.split_decodes_and_prefills(cm) == ((3, 0, 3, 0) if max(query_lens) == 1 else (2, 1, 2, 5))


HQ, HKV, D, BS = 2, 1, 16, 4


def _paged_args(rng):
    kc = rng.standard_normal((8, BS, HKV, D)).astype(np.float32)
    vc = rng.standard_normal((8, BS, HKV, D)).astype(np.float32)
    q = rng.standard_normal((5, HQ, D)).astype(np.float32)
    return q, kc, vc, np.array([0, 5], np.int32)


def test_paged_attention_refuses_a_sequence_shorter_than_its_query(rng):
    q, kc, vc, qo = _paged_args(rng)
    out = np.zeros_like(q)
    with pytest.raises(ValueError, match=r"request 0 has 5 query tokens but its sequence holds 3 tokens \(seq_lens"):
        kvattn.paged_attention(q, kc, vc, qo, out=out, block_table=np.array([[1, 2]], np.int32),
                               seq_lens=np.array([3], np.int32))
    with pytest.raises(ValueError, match=r"request 0 has 5 query tokens but its sequence holds 3 tokens \(from"):
        kvattn.paged_attention(q, kc, vc, qo, out=out, paged_kv_indptr=np.array([0, 1], np.int32),
                               paged_kv_indices=np.array([1], np.int32),
                               paged_kv_last_page_len=np.array([3], np.int32))
    assert not out.any()  # nothing ran

    # seq_len == q_len is a fresh prefill: runs, and row 0 attends to key 0 only.
    kvattn.paged_attention(q, kc, vc, qo, out=out, paged_kv_indptr=np.array([0, 2], np.int32),
                           paged_kv_indices=np.array([1, 2], np.int32),
                           paged_kv_last_page_len=np.array([1], np.int32))
    np.testing.assert_allclose(out[0, 0], vc[1, 0, 0], rtol=1e-5, atol=1e-6)
    # Non-causal attention (e.g. cross-attention) may have fewer keys than queries.
    out2 = np.zeros_like(q)
    kvattn.paged_attention(q, kc, vc, qo, out=out2, block_table=np.array([[1, 2]], np.int32),
                           seq_lens=np.array([1], np.int32), causal=False)
    np.testing.assert_allclose(out2[:, 0], np.broadcast_to(vc[1, 0, 0], (5, D)), rtol=1e-5, atol=1e-6)


def test_classify_request_refuses_negative_counts():
    assert kvattn.classify_request(1, 9, 9) == "decode"
    assert kvattn.classify_request(num_scheduled=7, num_computed=0, num_prompt=7) == "prefill"
    with pytest.raises(ValueError, match=r"counts must be >= 0, got num_scheduled = -1"):
        kvattn.classify_request(-1, 0, 5)
