// kvattn/kv/block_size.h — kernel block sizes: what a backend's kernels accept and how the
// worker picks one size per KV cache group (vLLM's `MultipleOf`, `_block_size_is_supported`,
// `select_common_block_size`, `prepare_kernel_block_sizes`, `customize_attention_spec` from
// vllm.v1.attention.backend and vllm.v1.worker.utils).
//
// The KV cache manager allocates *manager blocks* of spec.block_size tokens.  A backend whose
// kernels need smaller blocks gets every manager block split into `block_size / kernel`
// kernel blocks (virtual block splitting).  A backend declares its sizes as a list of exact
// sizes and `MultipleOf(base)` entries.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "kvattn/kv/kv_cache_config.h"
#include "kvattn/kv/kv_cache_spec.h"

namespace kvattn {

struct AttentionGroup;   // kvattn/kv/attention_group.h

// A kernel accepts any block size that is a multiple of `base` (> 0).
struct MultipleOf {
  int64_t base = 1;
  friend bool operator==(const MultipleOf&, const MultipleOf&) = default;
};

// One entry of a backend's supported kernel block sizes: an exact size or MultipleOf.
// std::monostate is an unset / unknown declaration: every function below rejects it with
// InvalidArgument ("Unknown supported size"), as vLLM does for a foreign type.
using KernelBlockSize = std::variant<std::monostate, int64_t, MultipleOf>;

// "16", "MultipleOf(16)" or "<unknown>".
std::string kernel_block_size_str(const KernelBlockSize& size);
// "[16, 32, MultipleOf(16)]".
std::string format_kernel_block_sizes(const std::vector<KernelBlockSize>& sizes);

// The slice of an attention backend these functions read (the full AttentionBackend traits
// live in attention/ and will provide one of these).  Empty functions mean vLLM's defaults.
struct BlockSizeBackend {
  std::string name;
  // get_supported_kernel_block_sizes(spec) (spec may be null).  Default: [MultipleOf(1)].
  std::function<std::vector<KernelBlockSize>(const KVCacheSpec* spec)> supported_kernel_block_sizes;
  // customize_spec(spec).  Default: the spec unchanged.
  std::function<std::shared_ptr<const AttentionSpec>(const std::shared_ptr<const AttentionSpec>&)>
      customize_spec;

  const std::string& get_name() const noexcept { return name; }
  std::vector<KernelBlockSize> get_supported_kernel_block_sizes(const KVCacheSpec* spec) const;

  // A backend accepting exactly `sizes` for every spec.
  static BlockSizeBackend with_sizes(std::string name, std::vector<KernelBlockSize> sizes);
};

// vLLM's `_block_size_is_supported`: true iff every backend has an entry equal to `block_size`
// (exact) or dividing it (MultipleOf).  `specs[i]` is backend i's spec (may be null); an empty
// `specs` means null for all.  InvalidArgument on an unknown entry, a non-positive size or base,
// or specs of the wrong length.
bool block_size_is_supported(const std::vector<const BlockSizeBackend*>& backends, int64_t block_size,
                             const std::vector<const KVCacheSpec*>& specs = {});

// vLLM's `select_common_block_size`: kv_manager_block_size when all backends accept it; else
// the largest *exact* size declared by any backend that divides kv_manager_block_size and
// that all backends accept; else InvalidArgument
// "No common block size for N (NAME: [sizes]; ...).".
int64_t select_common_block_size(int64_t kv_manager_block_size,
                                 const std::vector<const BlockSizeBackend*>& backends,
                                 const std::vector<const KVCacheSpec*>& specs = {});

// vLLM's `customize_attention_spec`: backend.customize_spec(spec); then, when the spec has no
// block_stride_alignment and every declared size is exact (and there is at least one), the
// alignment becomes MultipleOf(max size) (stored as the token count).
std::shared_ptr<const AttentionSpec> customize_attention_spec(const BlockSizeBackend& backend,
                                                              const std::shared_ptr<const AttentionSpec>& spec);

// vLLM's `prepare_kernel_block_sizes`: one kernel block size per KV cache group, indexed like
// kv_cache_config.kv_cache_groups, except that EncoderOnlyAttention groups get NO entry (as
// upstream; later group ids then run past the end).  Specs without layer views and Mamba keep
// their block size; attention groups packed block-outermost (some tensor covering the group has
// block_stride > layer_stride) keep the manager size; other attention groups use
// select_common_block_size over the group's attention groups.  `attn_groups[gid]` are the
// attention groups of KV cache group gid.  Unsupported for an unknown spec kind.
std::vector<int64_t> prepare_kernel_block_sizes(const KVCacheConfig& kv_cache_config,
                                                const std::vector<std::vector<AttentionGroup>>& attn_groups);

}  // namespace kvattn
