"""vLLM's attention spec classes.  Each is a subclass of the bound ``AttentionSpec`` that fixes
the kind; keyword arguments are vLLM's field names (``block_size``, ``num_kv_heads``,
``head_size``, ``dtype`` — a name, NumPy or PyTorch dtype — ``head_size_v``,
``sliding_window``, ``attention_chunk_size``, ``page_size_padded``, ``kv_quant_mode``, ...)."""
from __future__ import annotations

from ._kvattn import AttentionSpec


def _spec_class(name: str, kind: str, doc: str):
    def __init__(self, block_size, num_kv_heads, head_size, dtype, **kwargs):
        AttentionSpec.__init__(self, kind, block_size=block_size, num_kv_heads=num_kv_heads,
                               head_size=head_size, dtype=dtype, **kwargs)

    __init__.__doc__ = f"{name}(block_size, num_kv_heads, head_size, dtype, **options)"
    full_doc = (f"{doc}\n\n{name}(block_size, num_kv_heads, head_size, dtype, **options): an immutable "
                "AttentionSpec of this kind.\nOptions are vLLM's field names (head_size_v, sliding_window, "
                "attention_chunk_size, page_size_padded, kv_quant_mode, ...); page_size_bytes is one block's "
                "bytes per layer.")
    return type(name, (AttentionSpec,), {"__init__": __init__, "__doc__": full_doc})


FullAttentionSpec = _spec_class("FullAttentionSpec", "full_attention", "vLLM's FullAttentionSpec.")
MLAAttentionSpec = _spec_class("MLAAttentionSpec", "mla_attention",
                               "vLLM's MLAAttentionSpec (one latent vector per token: head_size_v = 0).")
SlidingWindowSpec = _spec_class("SlidingWindowSpec", "sliding_window",
                                "vLLM's SlidingWindowSpec (sliding_window= is required).")
SlidingWindowMLASpec = _spec_class("SlidingWindowMLASpec", "sliding_window_mla", "vLLM's SlidingWindowMLASpec.")
ChunkedLocalAttentionSpec = _spec_class("ChunkedLocalAttentionSpec", "chunked_local_attention",
                                        "vLLM's ChunkedLocalAttentionSpec (attention_chunk_size= is required).")
SinkFullAttentionSpec = _spec_class("SinkFullAttentionSpec", "sink_full_attention", "vLLM's SinkFullAttentionSpec.")
CrossAttentionSpec = _spec_class("CrossAttentionSpec", "cross_attention", "vLLM's CrossAttentionSpec.")
EncoderOnlyAttentionSpec = _spec_class("EncoderOnlyAttentionSpec", "encoder_only_attention",
                                       "vLLM's EncoderOnlyAttentionSpec.")

__all__ = ["FullAttentionSpec", "MLAAttentionSpec", "SlidingWindowSpec", "SlidingWindowMLASpec",
           "ChunkedLocalAttentionSpec", "SinkFullAttentionSpec", "CrossAttentionSpec", "EncoderOnlyAttentionSpec"]
