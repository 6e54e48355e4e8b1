"""Python-level wrappers over ``_kvattn``: the functions that produce a tensor return it in the
framework of their first array argument (zero-copy), and the vLLM helpers whose Python
signature takes Python objects (``bind_kv_cache``, ``mamba_get_block_table_tensor``)."""
from __future__ import annotations

import functools

from . import _kvattn
from ._convert import like, to_framework

__all__ = [
    "get_dcp_local_seq_lens", "compute_slot_mapping", "reshape_query_for_spec_decode",
    "reshape_attn_output_for_spec_decode", "split_kv_cache_layer_view", "mamba_get_block_table_tensor",
    "compute_mm_prefix_range_tensor", "make_xqa_draft_block_mask", "make_mock_block_table", "bind_kv_cache",
    "allocate_kv_cache", "get_seq_lens", "_make_xqa_draft_block_mask", "_make_xqa_ragged_draft_block_mask",
    "_compute_decode_query_lens", "_merge_supported_layouts", "_block_size_is_supported", "_layout_from_name",
]


def _returns_like(fn, arg_index=0):
    """Wrap a _kvattn function so a kvattn Tensor result comes back like args[arg_index]."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        ref = args[arg_index] if len(args) > arg_index else next(iter(kwargs.values()), None)
        if isinstance(out, tuple):
            return tuple(like(o, ref) for o in out)
        return like(out, ref)

    return wrapper


get_dcp_local_seq_lens = _returns_like(_kvattn.get_dcp_local_seq_lens)
compute_slot_mapping = _returns_like(_kvattn.compute_slot_mapping)
reshape_query_for_spec_decode = _returns_like(_kvattn.reshape_query_for_spec_decode)
reshape_attn_output_for_spec_decode = _returns_like(_kvattn.reshape_attn_output_for_spec_decode)
split_kv_cache_layer_view = _returns_like(_kvattn.split_kv_cache_layer_view)
get_seq_lens = _returns_like(_kvattn.get_seq_lens)
# vLLM's private names; `from _kvattn import *` skips underscored names.
_compute_decode_query_lens = _kvattn._compute_decode_query_lens
_merge_supported_layouts = _kvattn._merge_supported_layouts
_block_size_is_supported = _kvattn._block_size_is_supported
_layout_from_name = _kvattn._layout_from_name


def _on_device(array, device):
    """A NumPy array placed as vLLM's ``device`` argument asks: None -> the NumPy array; with
    PyTorch importable -> a torch tensor on ``device`` (a torch.device or a name); without
    PyTorch, "cpu" -> the NumPy array, any other device -> NotImplementedError."""
    if device is None:
        return array
    try:
        import torch
    except ImportError:
        if str(device) == "cpu":
            return array
        raise NotImplementedError(
            f"device={device!r}: placing the result on a device needs PyTorch (not importable here); "
            "pass device=None or 'cpu' for a NumPy array") from None
    return torch.from_numpy(array).to(device)


def _make_xqa_draft_block_mask(q_len: int, causal: bool, device=None):
    """vLLM's _make_xqa_draft_block_mask(q_len, causal, device): the packed XQA draft mask of a
    uniform request, uint16 [q_len, 2 * ceil(q_len / 32)] (vLLM's ``.view(torch.uint16)``
    layout: 32-bit words, low half first); row qi has bit kj set iff kj <= qi (causal) or
    kj < q_len.  device: see ``_on_device`` (None -> NumPy)."""
    return _on_device(_kvattn._make_xqa_draft_block_mask(q_len, causal), device)


def _make_xqa_ragged_draft_block_mask(q_lens, max_q_len: int, causal: bool, device=None):
    """vLLM's _make_xqa_ragged_draft_block_mask(q_lens, max_q_len, causal, device): uint16
    [sum(q_lens), 2 * ceil(max_q_len / 32)], one row per draft token of each request; bit kj is
    set iff kj < q_len of the row's request and (kj <= qi if causal).  q_lens: a list of ints
    (or any integer sequence / array).  device: as _make_xqa_draft_block_mask."""
    return _on_device(_kvattn._make_xqa_ragged_draft_block_mask([int(x) for x in q_lens], max_q_len, causal),
                      device)


def mamba_get_block_table_tensor(block_table, seq_lens, kv_cache_spec, mamba_cache_mode: str):
    """vLLM's mamba_get_block_table_tensor.

    "none": block_table itself.  "align" / "all": a fresh [num_reqs, 1 + num_speculative_blocks]
    int32 array, row r = block_table[r, max((seq_lens[r] - 1) // block_size, 0) + j].
    kv_cache_spec: a MambaSpec (block_size, num_speculative_blocks)."""
    if mamba_cache_mode == "none":
        return block_table
    out = _kvattn._mamba_get_block_table_tensor(
        block_table, seq_lens, kv_cache_spec.block_size,
        getattr(kv_cache_spec, "num_speculative_blocks", 0), mamba_cache_mode)
    return like(out, block_table)


def compute_mm_prefix_range_tensor(mm_prefix_range, num_seqs: int, device=None):
    """vLLM's compute_mm_prefix_range_tensor: [num_seqs, max_ranges, 2] int32 padded with
    (0, 0), or None.  device: None -> a NumPy array; "cpu"/"cuda" or a torch.device -> a torch
    tensor there (needs PyTorch)."""
    t = _kvattn.compute_mm_prefix_range_tensor(mm_prefix_range, num_seqs)
    if t is None:
        return None
    if device is None:
        return to_framework(t, "numpy")
    return to_framework(t, "torch").to(device)


def make_xqa_draft_block_mask(q_lens, causal: bool = True):
    """Packed XQA draft mask [sum(q_lens), ceil(max_q_len / 32)] int32 (NumPy)."""
    return to_framework(_kvattn.make_xqa_draft_block_mask(list(q_lens), causal), "numpy")


def make_mock_block_table(num_reqs: int, pages_per_req: int):
    """[num_reqs, pages_per_req] int32 NumPy array with entries r * P + 1 + c."""
    return to_framework(_kvattn.make_mock_block_table(num_reqs, pages_per_req), "numpy")


def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None, framework="kvattn"):
    """vLLM's allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None): ONE
    zero-filled allocation on ``device``; returns {layer_name: [B, H, N, C] view}.  layout: a
    KVCacheLayout or its name.  framework: "kvattn" (default; works for every dtype and
    device), "numpy" (CPU) or "torch"."""
    views = _kvattn.allocate_kv_cache(kv_cache_config, str(device), layout, kernel_block_sizes)
    return {name: to_framework(t, framework) for name, t in views.items()}


def bind_kv_cache(kv_caches: dict, forward_context: dict, runner_kv_caches: list, num_attn_module: int = 1,
                  kv_cache_groups=None, layer_kv_caches: dict | None = None) -> None:
    """vLLM's bind_kv_cache(kv_caches, forward_context, runner_kv_caches, num_attn_module=1,
    kv_cache_groups=None, layer_kv_caches=None).

    Appends the caches to ``runner_kv_caches`` (must be empty) ordered by layer index (names
    sharing an index keep ``kv_caches`` order) and binds every layer to
    ``(layer_kv_caches or kv_caches)[name]``: through the layer's ``bind_kv_cache(view)``
    method when it has one (vLLM's Attention), else by setting its ``kv_cache`` attribute, else
    by replacing the dict entry.  ``kv_cache_groups`` is accepted for vLLM's signature; vLLM
    uses it only to share ReplaySSM trackers, which kvattn does not have.  The ordering and every check
    (duplicate names, names without a layer index, layers missing from forward_context) are
    kvattn's C++ bind_kv_cache; nothing is bound when a check fails."""
    if runner_kv_caches:
        raise ValueError("bind_kv_cache: runner_kv_caches must be empty")
    names = list(kv_caches.keys())
    missing = [n for n in names if n not in forward_context]
    if missing:
        raise ValueError(f"bind_kv_cache: layer {missing[0]!r} is not in forward_context (an attention "
                         f"layer of the model); known layers: {sorted(forward_context)}")
    order = _kvattn._bind_kv_cache_order(names, num_attn_module)
    runner_kv_caches.extend(kv_caches[names[i]] for i in order)
    source = layer_kv_caches or kv_caches
    for name in names:
        layer = forward_context[name]
        if callable(getattr(layer, "bind_kv_cache", None)):
            layer.bind_kv_cache(source[name])
        elif hasattr(layer, "kv_cache"):
            layer.kv_cache = source[name]
        else:
            forward_context[name] = source[name]
