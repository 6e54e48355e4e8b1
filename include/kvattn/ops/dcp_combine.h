// kvattn/ops/dcp_combine.h — the device-side pieces of decode context parallelism (DCP):
// a strided copy, and the two LSE-weighted combines of partial attention outputs that
// vLLM's cp_lse_ag_out_rs and dcp_a2a_lse_reduce perform around their collectives
// (kvattn/attention/communicator.h composes them with a DcpCommunicator).
//
// Notation: W ranks, T tokens, H heads per rank (W*H after the query all-gather), D head dim.
// An LSE is "bad" when it is NaN or ±inf (a rank that saw no key reports -inf; FA2 reports
// +inf for an empty sequence).  The global LSE of a (t, head) row over ranks is
//   m = max over good lse_r (bad ones count as -inf);  g = m + log(sum_r exp(lse_r - m))
// with g = -inf when every rank is bad.  A rank's weight is exp(lse_r - g), or 0 when lse_r is
// bad or g = -inf.  exp/log are e-based or 2-based per `lse_base_e`.
#pragma once

#include "kvattn/core/tensor.h"

namespace kvattn::ops {

// dst[...] = src[...] element by element through both tensors' strides, converting between
// float dtypes (f32/f16/bf16/fp8, round to nearest even, fp8 saturating) — other dtypes must
// match exactly.  Same shape, same device; at most 8 dimensions.  CPU and CUDA.
void copy_(const Tensor& dst, const Tensor& src);

// dst[...] = float(src[...]) * scale, rounded to dst's float dtype (fp8 saturating): copy_ with a
// scale, for quantising (e.g. a query to fp8 with scale = 1 / q_scale).  Float dtypes only; the
// product is one f32 multiply, so CPU and CUDA results are bit-identical.  CPU and CUDA.
void scaled_copy_(const Tensor& dst, const Tensor& src, float scale);

// The step before cp_lse_ag_out_rs's reduce-scatter.
//   partial    [T, W*H, D] float (any strides): this rank's attention over its KV shard
//   all_lse    [W, T, W*H] f32: every rank's LSE of its partial (the all-gathered LSE)
//   rank       this rank, in [0, W)
//   packed     [W, T, H, D] f32 (contiguous) output: packed[w, t, h] = weight(rank) * partial[t, w*H + h]
//              — so a sum over ranks followed by taking block `rank` of dim 0 (a reduce-scatter
//              along dim 0) yields this rank's heads of the exact attention
//   global_lse optional [T, W*H] f32 output: g of every row
void dcp_lse_scale_pack(const Tensor& partial, const Tensor& all_lse, int64_t rank, bool lse_base_e,
                        const Tensor& packed, const Tensor& global_lse = Tensor());

// The step after dcp_a2a_lse_reduce's all-to-all: combines W partials of the same heads.
//   partials   [W, T, H, D] float (any strides): partial r = rank r's attention over its shard
//   lses       [W, T, H] f32: their LSEs
//   out        [T, H, D] float (any strides): sum_r weight(r) * partials[r]
//   global_lse optional [T, H] f32 output
void dcp_lse_combine(const Tensor& partials, const Tensor& lses, bool lse_base_e, const Tensor& out,
                     const Tensor& global_lse = Tensor());

}  // namespace kvattn::ops
