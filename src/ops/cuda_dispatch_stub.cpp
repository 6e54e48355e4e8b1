// Builds without CUDA: every CUDA entry of ops/ says so.  (Files ending in _stub.cpp are
// left out of CUDA builds; src/ops/cuda/ provides the real definitions there.)
#include <string>

#include "ops/cuda_dispatch.h"

namespace kvattn::ops::cuda_impl {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Unsupported(std::string(op) +
                    ": got CUDA tensors, but kvattn was built without CUDA kernels; pass CPU "
                    "tensors, or rebuild with -DKVATTN_CUDA=ON on a machine with the CUDA toolkit");
}
}  // namespace

bool available() noexcept { return false; }
void reshape_and_cache_flash(const ReshapeAndCacheArgs&) { no_cuda("reshape_and_cache_flash"); }
void paged_attention(const PagedAttentionArgs&) { no_cuda("paged_attention"); }
void merge_attn_states(const MergeAttnStatesArgs&) { no_cuda("merge_attn_states"); }
void mask_empty_context_lse(const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("mask_empty_context_lse");
}
void zero_kv_blocks(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("zero_kv_blocks");
}
void copy_page_indices(const Tensor&, const Tensor&, const Tensor&) { no_cuda("copy_page_indices"); }
void mamba_align_block_table(const Tensor&, const Tensor&, const Tensor&, int64_t) {
  no_cuda("mamba_align_block_table");
}
void kvfp8_dequant(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   const Tensor&, const Tensor&) {
  no_cuda("kvfp8_dequant");
}

void copy_(const Tensor&, const Tensor&, float) { no_cuda("copy_"); }
void dcp_lse_scale_pack(const Tensor&, const Tensor&, int64_t, bool, const Tensor&, const Tensor&) {
  no_cuda("dcp_lse_scale_pack");
}
void dcp_lse_combine(const Tensor&, const Tensor&, bool, const Tensor&, const Tensor&) { no_cuda("dcp_lse_combine"); }

}  // namespace kvattn::ops::cuda_impl
