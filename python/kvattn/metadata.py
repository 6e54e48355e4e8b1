"""vLLM's ``CommonAttentionMetadata`` as a small Python dataclass.

The fields hold the caller's own arrays (NumPy, PyTorch or CuPy; CPU or CUDA) under vLLM's
names; kvattn functions read them through zero-copy DLPack views.  Shapes and dtypes follow
vLLM (``query_start_loc`` int32 ``[num_reqs + 1]``, ``seq_lens`` int32 ``[num_reqs]``,
``block_table_tensor`` int32 ``[num_reqs, max_blocks]``, ``slot_mapping`` int64).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from . import _kvattn
from ._convert import framework_of, to_framework


@dataclass
class CommonAttentionMetadata:
    """Per-step batch description every attention backend reads (vLLM field names and order).

    Build it yourself from the caller's arrays (NumPy / PyTorch / CuPy; requests ordered decode
    -> extend -> prefill, see reorder_batch_to_split_decodes_and_prefills) or get it from
    ``BatchPreparer.prepare(input_batch)``.  Then ``split_decodes_and_prefills(cm)`` and
    ``FlashInferMetadataBuilder.build(common_prefix_len, cm)`` read it; ``validate()`` runs
    kvattn's checks.  kvattn reads the fields as zero-copy views; nothing is converted.
    """

    query_start_loc: Any
    """[num_reqs + 1] int32, device: cumulative query lengths, [0] = 0."""
    query_start_loc_cpu: Any
    """[num_reqs + 1] int32, host copy."""
    seq_lens: Any
    """[num_reqs] int32: context + this step's query tokens."""
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: Any
    """[num_reqs, max_blocks] int32 (kernel-)block ids."""
    slot_mapping: Any
    """[num_actual_tokens] int64, PAD_SLOT_ID (-1) = skip."""
    causal: bool = True
    encoder_seq_lens: Any = None
    encoder_seq_lens_cpu: Any = None
    dcp_local_seq_lens: Any = None
    dcp_local_seq_lens_cpu: Any = None
    positions: Any = None
    is_prefilling: Any = None
    """[num_reqs] bool/uint8: num_computed < num_prompt_tokens."""
    seq_lens_cpu_upper_bound: Any = None
    mm_req_doc_ranges: Optional[dict] = None
    """{row: [(start, end), ...]} inclusive PrefixLM ranges."""

    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    def naive_query_lens(self):
        """query_start_loc_cpu[1:] - query_start_loc_cpu[:-1] (in the caller's framework)."""
        q = self.query_start_loc_cpu
        return q[1:] - q[:-1]

    def replace(self, **kwargs) -> "CommonAttentionMetadata":
        return dataclasses.replace(self, **kwargs)

    def unpadded(self, num_actual_tokens: int, num_actual_reqs: int) -> "CommonAttentionMetadata":
        """Per-request fields sliced to [:num_actual_reqs] (query_start_loc to +1), per-token
        fields to [:num_actual_tokens]; views, as vLLM."""
        if not 0 <= num_actual_reqs <= self.num_reqs:
            raise ValueError(f"unpadded: num_actual_reqs = {num_actual_reqs} is outside [0, {self.num_reqs}]")
        if not 0 <= num_actual_tokens <= self.num_actual_tokens:
            raise ValueError(
                f"unpadded: num_actual_tokens = {num_actual_tokens} is outside [0, {self.num_actual_tokens}]")
        r, t = num_actual_reqs, num_actual_tokens

        def cut(x, n):
            return None if x is None else x[:n]

        return dataclasses.replace(
            self,
            query_start_loc=cut(self.query_start_loc, r + 1),
            query_start_loc_cpu=cut(self.query_start_loc_cpu, r + 1),
            seq_lens=cut(self.seq_lens, r),
            num_reqs=r,
            num_actual_tokens=t,
            block_table_tensor=cut(self.block_table_tensor, r),
            slot_mapping=cut(self.slot_mapping, t),
            encoder_seq_lens=cut(self.encoder_seq_lens, r),
            encoder_seq_lens_cpu=cut(self.encoder_seq_lens_cpu, r),
            dcp_local_seq_lens=cut(self.dcp_local_seq_lens, r),
            dcp_local_seq_lens_cpu=cut(self.dcp_local_seq_lens_cpu, r),
            positions=cut(self.positions, t),
            is_prefilling=cut(self.is_prefilling, r),
            seq_lens_cpu_upper_bound=cut(self.seq_lens_cpu_upper_bound, r),
        )

    def validate(self) -> None:
        """kvattn's shape/dtype/value checks (ValueError naming the first bad row)."""
        _kvattn._validate_common_attn_metadata(self)

    @classmethod
    def _from_fields(cls, fields: dict, framework: str = "kvattn") -> "CommonAttentionMetadata":
        conv = {k: to_framework(v, framework) for k, v in fields.items()}
        return cls(**conv)


def _batch_preparer_prepare(self, input_batch, num_reqs_padded: int = -1, num_tokens_padded: int = -1,
                            framework: str = "numpy") -> CommonAttentionMetadata:
    """This step's CommonAttentionMetadata built from ``input_batch`` rows 0..num_reqs-1.

    Fields are zero-copy views of the preparer's persistent buffers (valid until its next
    prepare), as ``framework`` arrays ("numpy", "torch", "cupy" or "kvattn").
    num_reqs_padded / num_tokens_padded append zero-length requests / PAD_SLOT_ID slots for
    CUDA graphs (-1 = none)."""
    fields = self._prepare_fields(input_batch, num_reqs_padded, num_tokens_padded)
    return CommonAttentionMetadata._from_fields(fields, framework)


_kvattn.BatchPreparer.prepare = _batch_preparer_prepare


@dataclass
class PagedKVMetadata:
    """The paged-KV description of one step, as vLLM's FlashInfer backend computes it
    (``PagedKVMetadataBuilder.build``).  Arrays are zero-copy views of the builder's persistent
    buffers in the framework of ``common_attn_metadata.query_start_loc_cpu``, valid until the
    builder's next ``build``."""

    paged_kv_indptr: Any
    """[num_reqs + 1] int32 (device copy): page offsets, [0] = 0."""
    paged_kv_indices: Any
    """[num_actual_pages] int32 (device copy): the pages of request r are indices[indptr[r]:indptr[r+1]]."""
    paged_kv_last_page_len: Any
    """[num_reqs] int32 (device copy): tokens in each request's last page (1..page_size; 0: no pages)."""
    paged_kv_indptr_cpu: Any
    paged_kv_indices_cpu: Any
    paged_kv_last_page_len_cpu: Any
    seq_lens_cpu: Any
    """[num_reqs] int32: the lengths the pages were counted from (DCP: this rank's local share)."""
    num_reqs: int
    num_actual_pages: int
    use_cascade: bool
    """common_prefix_len > 0: the first num_common_kv_blocks pages are shared (cascade)."""
    num_common_kv_blocks: int
    shared_kv_page_indices: Any
    shared_kv_last_page_len: int


def _paged_kv_build(self, common_attn_metadata, num_decodes: int = 0, common_prefix_len: int = 0) -> PagedKVMetadata:
    """This step's paged_kv_indptr / paged_kv_indices / paged_kv_last_page_len.

    ``common_attn_metadata``: a CommonAttentionMetadata whose first ``num_decodes`` rows are
    decodes (``split_decodes_and_prefills``; it matters under DCP only).  ``common_prefix_len``
    > 0 (a multiple of page_size) selects cascade: those pages become the shared level.
    ValueError naming the row for a bad length, block id or table width."""
    fields = self._build_fields(common_attn_metadata, num_decodes, common_prefix_len)
    framework = framework_of(common_attn_metadata.query_start_loc_cpu)
    return PagedKVMetadata(**{k: to_framework(v, framework) for k, v in fields.items()})


_kvattn.PagedKVMetadataBuilder.build = _paged_kv_build

__all__ = ["CommonAttentionMetadata", "PagedKVMetadata"]
