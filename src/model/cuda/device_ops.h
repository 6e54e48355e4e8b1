// src/model/cuda/device_ops.h — the CUDA compute of the model layer: cuBLAS GEMMs and kvattn's
// own kernels for the small ops of a decoder block (embedding, RMSNorm, rotary embedding,
// activation·mul, residual add, soft cap), the device counterpart of cpu_math.h.
//
// Every op takes raw device pointers with explicit sizes and strides (in elements) and is
// enqueued on the default stream (the stream kvattn's attention kernels use), so ops of one
// step run in order without synchronisation.  Activations are in the compute dtype `t`
// (f32, bf16 or f16); inside every kernel the arithmetic is f32 and the result is rounded once
// to `t`.  Nothing here allocates except Gemm's construction (the cuBLAS handle and its
// workspace).  Errors: InvalidArgument for a bad size or dtype, Error naming the op and the
// CUDA / cuBLAS status for a failed launch.
#pragma once

#include <cstdint>

#include "kvattn/core/dtype.h"

namespace kvattn::model::gpu {

// out[t, :H] = table[ids[t], :H] * scale (table rows `hidden` elements, dtype t; ids already
// validated by the caller).
void embedding(const int32_t* ids, int64_t tokens, const void* table, int64_t hidden, float scale, void* out,
               DType t);

// RMSNorm of `rows` rows of `dim` elements: out = x / sqrt(mean(x^2) + eps) * (w or 1 + w),
// sum of squares in f32.  x rows are `x_stride` elements apart, out rows `out_stride` apart;
// out == x (same strides) is allowed.  w: [dim] in dtype t.  `plus_one`: Gemma's (1 + w).
void rms_norm(const void* x, int64_t rows, int64_t dim, int64_t x_stride, const void* w, float eps, bool plus_one,
              void* out, int64_t out_stride, DType t);

// vLLM's fused_add_rms_norm: residual[r, :] += x[r, :] (rounded to t), then
// out[r, :] = rms_norm(residual[r, :]).  All rows contiguous (`dim` apart); out may equal x.
void add_rms_norm(const void* x, void* residual, int64_t rows, int64_t dim, const void* w, float eps, bool plus_one,
                  void* out, DType t);

// Rotary embedding, neox style (HF's rotate_half), in place: for token i and head h the vector
// x[i, h, :head_dim] is split in halves (a, b) and becomes (a c - b s, b c + a s) with
// c = cos_table[positions[i], :head_dim/2], s = sin_table[...] (f32 tables the caller
// precomputes, [max_position, head_dim / 2]).  Heads are `head_stride` elements apart, tokens
// `token_stride`.
void rope_neox(void* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride, int64_t head_stride,
               const int64_t* positions, const float* cos_table, const float* sin_table, DType t);

enum class GatedActivation { silu, gelu_tanh };

// out[i, j] = act(gate_up[i, j]) * gate_up[i, inter + j] over the fused [tokens, 2 * inter]
// gate/up rows; out is [tokens, inter].
void act_mul(const void* gate_up, int64_t tokens, int64_t inter, GatedActivation act, void* out, DType t);

// y[i] += x[i], n elements.
void add_inplace(void* y, const void* x, int64_t n, DType t);

// x[i] = cap * tanh(x[i] / cap), n elements.
void soft_cap(void* x, int64_t n, float cap, DType t);

// Copies rows: out[i, :] = x[rows[i], :] for `n` rows of `dim` elements (rows: device int64).
void gather_rows(const void* x, int64_t dim, const int64_t* rows, int64_t n, void* out, DType t);

// Converts n elements between dtypes (f32 / bf16 / f16), e.g. weights at upload.
void convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n);

// cuBLAS for nn.Linear: y[M, N] = x[M, K] · w[N, K]^T (+ bias[N]).  x and w in `in_t`, y in
// `out_t` (= in_t, or f32 for logits), bias in out_t; f32 accumulation.  For f32 inputs the
// compute is pedantic f32 (no TF32), so f32 results match a CPU f32 reference to ~1e-6.
// x rows `ldx` elements apart (>= K), y rows `ldy` apart (>= N).  One handle per Gemm object,
// bound to the default stream; not thread-safe.
class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void linear(const void* x, int64_t M, int64_t K, int64_t ldx, const void* w, int64_t N, const void* bias, void* y,
              int64_t ldy, DType in_t, DType out_t);

 private:
  void* handle_ = nullptr;     // cublasHandle_t
  void* workspace_ = nullptr;  // device workspace for cuBLAS
};

}  // namespace kvattn::model::gpu
