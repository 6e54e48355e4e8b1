// merge_attn_states and mask_empty_context_lse: check once, then dispatch on the device.
#include "kvattn/ops/merge_attn_states.h"

#include "ops/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda_dispatch.h"

namespace kvattn::ops {
using namespace detail;

void merge_attn_states(const MergeAttnStatesArgs& args) {
  const MergeDims d = validate_merge(args);
  if (args.output.device().is_cuda()) return cuda_impl::merge_attn_states(args);
  cpu::merge_attn_states(args, d);
}

void merge_attn_states(const Tensor& output, const Tensor& prefix_output, const Tensor& prefix_lse,
                       const Tensor& suffix_output, const Tensor& suffix_lse, const Tensor& output_lse,
                       std::optional<int64_t> prefill_tokens_with_context, const Tensor& output_scale) {
  MergeAttnStatesArgs a;
  a.output = output; a.prefix_output = prefix_output; a.prefix_lse = prefix_lse;
  a.suffix_output = suffix_output; a.suffix_lse = suffix_lse; a.output_lse = output_lse;
  a.prefill_tokens_with_context = prefill_tokens_with_context; a.output_scale = output_scale;
  merge_attn_states(a);
}

void mask_empty_context_lse(const Tensor& lse, const Tensor& query_start_loc, const Tensor& context_start_loc) {
  validate_mask_empty_context_lse(lse, query_start_loc, context_start_loc);
  if (lse.device().is_cuda()) return cuda_impl::mask_empty_context_lse(lse, query_start_loc, context_start_loc);
  cpu::mask_empty_context_lse(lse, query_start_loc, context_start_loc);
}

}  // namespace kvattn::ops
