// kvattn/ops/merge_attn_states.h — combine two partial attention results by their LSE.
//
// vLLM `merge_attn_states` (arXiv 2501.01005 §2.2).  Per token t and head h, with natural-log
// LSEs p = prefix_lse[h, t], s = suffix_lse[h, t]:
//   +inf LSEs (FA2's empty-sequence convention) are read as -inf;  m = max(p, s);
//   m == -inf (both empty):  out = prefix_output,  out_lse = -inf
//   else: a = exp(p - m) / (exp(p - m) + exp(s - m)),  b = 1 - a (computed as exp(s-m)/sum),
//         out = a * prefix_output + b * suffix_output,  out_lse = log(sum) + m
//   t >= prefill_tokens_with_context:  out = suffix_output, out_lse = suffix_lse (no merge)
//   fp8 output: out = saturate(out / output_scale).
#pragma once

#include <optional>

#include "kvattn/core/tensor.h"

namespace kvattn::ops {

struct MergeAttnStatesArgs {
  Tensor output;         // [num_tokens, num_heads, head_dim] f32/f16/bf16, or fp8_e4m3/e5m2
                         //   (then output_scale is required)
  Tensor prefix_output;  // [num_tokens, num_heads, head_dim] f32/f16/bf16
  Tensor prefix_lse;     // [num_heads, num_tokens] f32, natural log
  Tensor suffix_output;  // [num_tokens, num_heads, head_dim] same dtype as prefix_output
  Tensor suffix_lse;     // [num_heads, num_tokens] f32, natural log
  Tensor output_lse;     // optional [num_heads, num_tokens] f32
  std::optional<int64_t> prefill_tokens_with_context;  // tokens >= this take the suffix only
  Tensor output_scale;   // optional [1] f32 on the output's device (fp8 output only)
};

void merge_attn_states(const MergeAttnStatesArgs& args);

// vLLM argument order.
void merge_attn_states(const Tensor& output, const Tensor& prefix_output, const Tensor& prefix_lse,
                       const Tensor& suffix_output, const Tensor& suffix_lse,
                       const Tensor& output_lse = Tensor(),
                       std::optional<int64_t> prefill_tokens_with_context = std::nullopt,
                       const Tensor& output_scale = Tensor());

// Sets lse[:, query_start_loc[r] : query_start_loc[r+1]] = -inf for every request r whose
// context chunk is empty (context_start_loc[r] == context_start_loc[r+1]).
//   lse               [num_heads, num_tokens] f32 (modified in place)
//   query_start_loc   [num_reqs + 1] int32/int64, non-decreasing, last <= num_tokens
//   context_start_loc [num_reqs + 1] int32/int64
void mask_empty_context_lse(const Tensor& lse, const Tensor& query_start_loc,
                            const Tensor& context_start_loc);

}  // namespace kvattn::ops
