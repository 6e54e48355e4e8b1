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

void set_prefill_kernel_mode(int) {}
int prefill_kernel_mode() noexcept { return 0; }
void set_prefill_kernel_v6(bool) {}
bool prefill_kernel_v6() noexcept { return false; }
int64_t prefill_kernel_launches() noexcept { return 0; }
void set_prefill_hopper_mode(int) {}
int prefill_hopper_mode() noexcept { return 0; }
int64_t prefill_hopper_launches() noexcept { return 0; }
int last_prefill_kernel_path() noexcept { return -1; }
const char* last_prefill_kernel_reason() noexcept { return "a build without CUDA"; }
void set_page_decode_mode(int) {}
int page_decode_mode() noexcept { return 0; }
int64_t page_decode_launches() noexcept { return 0; }
void set_small_decode_mode(int) {}
int small_decode_mode() noexcept { return 0; }
int64_t small_decode_launches() noexcept { return 0; }
void set_small_decode_kernel(int) {}
int64_t small_cluster_launches() noexcept { return 0; }
void set_small_cluster_max(int) {}
int small_cluster_max() noexcept { return 16; }
void set_small_page_window(bool) {}
bool small_page_window() noexcept { return false; }
void set_small_warps(int) {}
int small_warps() noexcept { return 0; }
int64_t small_cluster_launches_8warps() noexcept { return 0; }
void set_small_route8(bool) {}
void set_decode_options(int) {}
int decode_options() noexcept { return 0; }
int64_t fp8_fast_launches() noexcept { return 0; }
int64_t rem_split_plans() noexcept { return 0; }
int64_t streamk_launches() noexcept { return 0; }
void set_decode_splits(int) {}
void set_decode_chunk(int) {}
void set_cache_write_variant(int) {}
int cache_write_variant() noexcept { return 0; }

}  // namespace kvattn::ops::cuda_impl
