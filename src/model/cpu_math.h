// src/model/cpu_math.h — the CPU compute of the model layer: one GEMM (OpenBLAS sgemm) and the
// small element-wise / row-wise ops of a decoder block, all in f32.
//
// Every op takes raw row-major pointers with explicit sizes; callers own the buffers (sized
// once at construction), so nothing here allocates.  The GEMM runs on OpenBLAS's thread pool
// (set_num_threads); the small ops are single-threaded loops the compiler vectorises: at the
// shapes a step has they cost a small fraction of the GEMMs.
#pragma once

#include <cstdint>

namespace kvattn::model::cpu {

// Threads OpenBLAS uses for every GEMM of this process (n <= 0: the machine's cores).
void set_num_threads(int n);
int num_threads();

// y[M, N] = x[M, K] · w[N, K]^T (+ bias[N] when not null): a PyTorch nn.Linear over M rows.
// One sgemm, or one sgemv per row when M < 4 (decode steps).
// x rows are `ldx` floats apart (>= K); y rows `ldy` floats apart (>= N).
void linear(const float* x, int64_t M, int64_t K, int64_t ldx, const float* w, int64_t N, const float* bias, float* y,
            int64_t ldy);

// RMSNorm of `rows` rows of `dim` floats, rows `stride` floats apart, in place or into `out`
// (same strides): out = x / sqrt(mean(x^2) + eps) * (w or 1 + w).  The mean is accumulated in
// double.  `plus_one`: Gemma's (1 + w) weight.
void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t stride, const float* w, double eps, bool plus_one,
              float* out);

// Rotary embedding, neox style (HF Llama's rotate_half): for each token t and head h the
// vector x[t, h, :head_dim] is split in halves (a, b) and becomes (a cos - b sin, b cos + a sin)
// with cos/sin[t, :head_dim/2].  Heads are `head_stride` floats apart, tokens `token_stride`.
void rope_neox(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride, int64_t head_stride,
               const float* cos, const float* sin);

// out[t, i] = act(gate_up[t, i]) * gate_up[t, I + i] for the fused [T, 2I] gate/up rows.
void silu_mul(const float* gate_up, int64_t tokens, int64_t inter, float* out);
void gelu_tanh_mul(const float* gate_up, int64_t tokens, int64_t inter, float* out);

// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);
// x[i] *= s
void scale_inplace(float* x, int64_t n, float s);
// x[i] = cap * tanh(x[i] / cap)
void soft_cap(float* x, int64_t n, double cap);

}  // namespace kvattn::model::cpu
