"""kvattn — the attention layer of an LLM serving engine (paged KV cache, batch preparation,
attention kernels), callable from NumPy and PyTorch without copies, under vLLM's names.

Tensors cross the boundary through DLPack: ``kvattn.from_dlpack(x)`` views any object with
``__dlpack__`` (NumPy arrays, PyTorch/CuPy tensors), and ``numpy.asarray(t)`` /
``torch.from_dlpack(t)`` view a kvattn Tensor.  Functions that compute a new tensor return it
in the framework of their first array argument.  Ops write into the arrays the caller passes
(vLLM's ``out=`` style).  Errors from the C++ library arrive as ``ValueError`` (invalid
argument), ``NotImplementedError`` (unsupported), ``MemoryError`` (out of memory) or
``RuntimeError`` (internal error), carrying the library's message.  See python/DESIGN.md.

One engine step, as vLLM's model runner takes it (README.md has it in full)::

    backend = kvattn.FlashInferBackend()
    impl = backend.make_impl(config, num_heads=..., head_size=..., scale=..., num_kv_heads=...)
    builder = backend.make_builder(spec, [layer_name], config)
    metadata = builder.build(0, common_attn_metadata)          # plan the step
    impl.do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
    impl.forward(layer, query, key, value, kv_cache, metadata, out)

Contents by topic (each name has its own docstring: ``help(kvattn.NAME)``):

Tensors and devices
    Tensor, from_dlpack, empty, zeros, dtype_names, cuda_available, built_with_cuda,
    framework_of, to_framework, like

KV cache dtype (vLLM's kv_cache_dtype spellings)
    KVCacheDType, parse_kv_cache_dtype, kv_cache_dtype_name, kv_cache_dtype_choices,
    kv_cache_storage_dtype

KV cache layouts
    KVCacheLayout, layout_from_name, _layout_from_name, get_flashinfer_layout_string,
    merge_supported_layouts, _merge_supported_layouts, get_supported_kv_cache_layouts, CacheConfig,
    resolve_kv_cache_layout, resolve_kv_cache_layout_from_env, record_kv_cache_layout,
    kv_cache_layout_from_env, compute_layout_strides, compute_layer_kv_cache_shape_bytes,
    create_kv_cache_views, restride_blocks_first_kv_cache_to_kv_first_storage

KV cache specs (vLLM's spec family) and quantisation
    KVCacheSpec, AttentionSpec, FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec,
    MLAAttentionSpec, SlidingWindowMLASpec, SinkFullAttentionSpec, CrossAttentionSpec,
    EncoderOnlyAttentionSpec, MambaSpec, UniformTypeKVCacheSpecs, iter_layer_specs, KVQuantMode,
    get_kv_quant_mode, is_per_token_head, is_nvfp4, is_quantized_kv_cache

Memory plan and allocation
    KVCacheTensor, KVCacheGroupSpec, KVCacheConfig, get_kv_cache_groups, get_kv_cache_config,
    get_kv_cache_config_from_groups, materialize_kv_cache_config, validate_kv_cache_config,
    get_kv_cache_bytes_per_block, kv_cache_memory_needed, estimate_max_model_len,
    add_kv_sharing_layers_to_kv_cache_groups, allocate_kv_cache, bind_kv_cache,
    extract_layer_index, MemorySnapshot, request_memory, KVPlan, plan_kv_cache,
    model_preset_names, parse_memory_size

Kernel blocks (manager block -> kernel block) and zeroing
    MultipleOf, BlockSizeBackend, block_size_is_supported, _block_size_is_supported,
    select_common_block_size,
    customize_attention_spec, AttentionGroup, map_kv_caches_to_kernel_blocks,
    prepare_kernel_block_sizes, KVBlockZeroer, zero_kv_blocks

Batch preparation (one step's CommonAttentionMetadata)
    CommonAttentionMetadata, InputBatch, classify_request,
    reorder_batch_to_split_decodes_and_prefills, BatchPreparer, split_decodes_and_prefills,
    split_decodes_prefills_and_extends, split_prefill_chunks, is_uniform_query_len,
    get_uniform_decode_token_count, compute_slot_mapping, PAD_SLOT_ID, NULL_BLOCK_ID,
    get_dcp_local_seq_lens, reshape_query_for_spec_decode, reshape_attn_output_for_spec_decode,
    mamba_get_block_table_tensor, mamba_align_block_table, PlaceholderRange,
    MultiModalFeatureSpec, compute_mm_prefix_ranges, compute_mm_prefix_ranges_by_req_id,
    compute_mm_prefix_range_tensor, fill_mm_prefix_query_ranges

Paged-KV metadata (what FlashInfer's plan reads)
    PagedKVMetadataBuilder, PagedKVMetadata, copy_page_indices, get_seq_lens,
    make_mock_block_table, use_cascade_attention

Ops (CPU or CUDA, chosen by the tensors' device)
    reshape_and_cache_flash, paged_attention, PagedAttentionPlan, merge_attn_states,
    cascade_attention, dcp_prefill_attention, split_kv_cache_layer_view, log2_lse_to_ln,
    mask_empty_context_lse, kvfp8_dequant, make_xqa_draft_block_mask, set_cpu_num_threads,
    cpu_num_threads, cuda_ops_available

Attention backend (vLLM's FlashInfer backend contract on kvattn's kernels)
    FlashInferBackend, BackendConfig, AttentionLayer, AttentionImpl, FlashInferImpl,
    AttentionMetadataBuilder, FlashInferMetadataBuilder, AttentionMetadata, FlashInferMetadata,
    PerLayerParameters, get_per_layer_parameters, infer_global_hyperparameters,
    get_num_attention_heads_from_layers, get_query_lens_mismatch_unsupported_backend,
    _make_xqa_draft_block_mask, _make_xqa_ragged_draft_block_mask, _compute_decode_query_lens

Offline generation (vLLM's LLM.generate on a Hugging Face model directory)
    LLM, SamplingParams, RequestOutput, CompletionOutput
"""
from ._kvattn import *  # noqa: F401,F403
from ._kvattn import __version__  # noqa: F401
from . import _kvattn
from ._convert import framework_of, like, to_framework  # noqa: F401
from .metadata import CommonAttentionMetadata, PagedKVMetadata  # noqa: F401
from .specs import (  # noqa: F401
    ChunkedLocalAttentionSpec, CrossAttentionSpec, EncoderOnlyAttentionSpec, FullAttentionSpec,
    MLAAttentionSpec, SinkFullAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec)
from .wrappers import *  # noqa: F401,F403
from .llm import LLM  # noqa: F401,E402
from . import llm as _llm, metadata as _metadata, specs as _specs, wrappers as _wrappers

# Every public name: the extension's (its underscored internals left out) and the Python
# layers' (their own __all__, which includes vLLM's private names such as
# _merge_supported_layouts).  `help(kvattn)` documents exactly these.
__all__ = sorted(
    {n for n in dir(_kvattn) if not n.startswith("_")}
    | {"framework_of", "like", "to_framework"}
    | set(_llm.__all__) | set(_metadata.__all__) | set(_specs.__all__) | set(_wrappers.__all__))
del _llm, _metadata, _specs, _wrappers
