"""Shared helpers of the kvattn pytest suite."""
import numpy as np
import pytest

import kvattn


def make_cm(query_lens, seq_lens=None, num_tokens=None, block_table=None, is_prefilling=None):
    """A CommonAttentionMetadata over NumPy arrays (vLLM's create_common_attn_metadata shape)."""
    q = np.asarray(query_lens, dtype=np.int32)
    qsl = np.zeros(len(q) + 1, dtype=np.int32)
    qsl[1:] = np.cumsum(q)
    if seq_lens is None:
        seq_lens = [10 * (i + 1) for i in range(len(q))]
    s = np.asarray(seq_lens, dtype=np.int32)
    n = int(qsl[-1]) if num_tokens is None else num_tokens
    if block_table is None:
        block_table = np.zeros((len(q), 4), dtype=np.int32)
    return kvattn.CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=s, num_reqs=len(q), num_actual_tokens=n,
        max_query_len=int(q.max()) if len(q) else 0, max_seq_len=int(s.max()) if len(s) else 0,
        block_table_tensor=block_table, slot_mapping=np.full(max(n, 1), -1, dtype=np.int64)[:n],
        seq_lens_cpu_upper_bound=s,
        is_prefilling=None if is_prefilling is None else np.asarray(is_prefilling, dtype=np.bool_))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
