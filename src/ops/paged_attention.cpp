// paged_attention and its helpers: check once, then dispatch on the query's device.
#include "kvattn/ops/paged_attention.h"

#include <algorithm>

#include "ops/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda_dispatch.h"
#include "ops/plan_state.h"

namespace kvattn::ops {
using namespace detail;

KvLengthsHint classify_kv_lengths(std::span<const int32_t> kv_lens) noexcept {
  int32_t lo = 0, hi = 0;
  for (int32_t l : kv_lens) {
    if (l <= 0) continue;
    lo = lo == 0 ? l : std::min(lo, l);
    hi = std::max(hi, l);
  }
  if (hi == 0) return KvLengthsHint::unknown;
  return int64_t(hi) >= 2 * int64_t(lo) ? KvLengthsHint::mixed : KvLengthsHint::uniform;
}

PagedAttentionPlan::PagedAttentionPlan() : state_(std::make_shared<State>()) {}
void PagedAttentionPlan::invalidate() noexcept { state_->valid.store(false, std::memory_order_relaxed); }
int64_t PagedAttentionPlan::plans() const noexcept { return state_->plans.load(std::memory_order_relaxed); }
int64_t PagedAttentionPlan::reuses() const noexcept { return state_->reuses.load(std::memory_order_relaxed); }

void paged_attention(const PagedAttentionArgs& args) {
  const AttnDims d = validate_paged_attention(args);
  if (args.query.device().is_cuda()) {
    PagedAttentionArgs a = args;
    a.sm_scale = d.sm_scale;
    return cuda_impl::paged_attention(a);
  }
  cpu::paged_attention(args, d);
}

std::pair<Tensor, Tensor> split_kv_cache_layer_view(const Tensor& layer_view, int64_t head_size) {
  KVATTN_CHECK(layer_view.dim() == 4,
               "split_kv_cache_layer_view: expected the per-layer view [num_blocks, num_heads, block_size, "
               "2 * head_size], got shape {}", layer_view.shape().str());
  KVATTN_CHECK(head_size > 0 && layer_view.size(3) == 2 * head_size,
               "split_kv_cache_layer_view: the content dim C = {} must be 2 * head_size = {} (K and V "
               "concatenated); view the byte cache as its element dtype first", layer_view.size(3), 2 * head_size);
  const Tensor nhd = layer_view.transpose(1, 2);  // [B, N, H, C]
  auto parts = nhd.split(head_size, 3);
  return {parts[0], parts[1]};
}

Tensor make_xqa_draft_block_mask(const std::vector<int64_t>& q_lens, bool causal) {
  int64_t total = 0, max_q = 0;
  for (int64_t q : q_lens) {
    KVATTN_CHECK(q >= 0, "make_xqa_draft_block_mask: query length {} must be >= 0", q);
    total += q;
    max_q = std::max(max_q, q);
  }
  const int64_t words = std::max<int64_t>(1, (max_q + 31) / 32);
  std::vector<int32_t> bits(static_cast<size_t>(total * words), 0);
  int64_t row = 0;
  for (int64_t q : q_lens)
    for (int64_t i = 0; i < q; ++i, ++row)
      for (int64_t j = 0; j < q; ++j)
        if (!causal || j <= i) {
          uint32_t w = static_cast<uint32_t>(bits[static_cast<size_t>(row * words + j / 32)]);
          w |= 1u << (j % 32);
          bits[static_cast<size_t>(row * words + j / 32)] = static_cast<int32_t>(w);
        }
  return Tensor::from_vector(bits, Dims{total, words});
}

void log2_lse_to_ln(const Tensor& lse) {
  KVATTN_CHECK(lse.device().is_cpu() && lse.dtype() == DType::f32,
               "log2_lse_to_ln: expects a float32 CPU tensor, got {} on {}", dtype_name(lse.dtype()),
               lse.device().str());
  Tensor c = lse.contiguous();
  float* p = c.data_ptr<float>();
  for (int64_t i = 0; i < c.numel(); ++i) p[i] *= 0.6931471805599453f;
  if (c.data() != lse.data()) {
    Tensor dst = lse;
    dst.copy_from(c);
  }
}

}  // namespace kvattn::ops
