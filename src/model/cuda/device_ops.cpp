// src/model/cuda/device_ops.cpp — the validated entry points of device_ops.h: sizes and dtypes
// are checked here (InvalidArgument naming the op and the bad value), then device_ops.cu's
// launcher enqueues the kernel and its launch status is checked.
#include "model/cuda/device_ops.h"

#include <fmt/format.h>

#include <cmath>

#include "kvattn/core/error.h"
#include "model/cuda/device_kernels.h"

namespace kvattn::model::gpu {

namespace {

bool is_compute_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

void check_dtype(DType t, const char* op) {
  KVATTN_CHECK(is_compute_dtype(t), "{}: dtype {} is not a compute dtype; valid: float32, bfloat16, float16", op,
               dtype_name(t));
}

void check_launch(int err, const char* op) {
  if (err == 0) return;
  throw InternalError(fmt::format("{}: CUDA kernel launch failed: error {} ({}: {}); if this follows an earlier "
                                  "failure the context may be corrupted — run under compute-sanitizer",
                                  op, err, kernels::error_name(err), kernels::error_string(err)));
}

}  // namespace

void embedding(const int32_t* ids, int64_t tokens, const void* table, int64_t hidden, float scale, void* out,
               DType t) {
  constexpr const char* op = "gpu::embedding";
  check_dtype(t, op);
  KVATTN_CHECK(tokens >= 0 && hidden > 0, "{}: tokens {} must be >= 0 and hidden {} > 0", op, tokens, hidden);
  if (tokens == 0) return;
  check_launch(kernels::embedding(ids, tokens, table, hidden, scale, out, t), op);
}

void rms_norm(const void* x, int64_t rows, int64_t dim, int64_t x_stride, const void* w, float eps, bool plus_one,
              void* out, int64_t out_stride, DType t) {
  constexpr const char* op = "gpu::rms_norm";
  check_dtype(t, op);
  KVATTN_CHECK(rows >= 0 && dim > 0, "{}: rows {} must be >= 0 and dim {} > 0", op, rows, dim);
  KVATTN_CHECK(x_stride >= dim && out_stride >= dim, "{}: strides (x {}, out {}) must be >= dim {}", op, x_stride,
               out_stride, dim);
  KVATTN_CHECK(out != x || x_stride == out_stride,
               "{}: in place (out == x) needs equal strides, got x {} and out {}", op, x_stride, out_stride);
  if (rows == 0) return;
  check_launch(kernels::rms_norm(x, rows, dim, x_stride, w, eps, plus_one, out, out_stride, t), op);
}

void add_rms_norm(const void* x, void* residual, int64_t rows, int64_t dim, const void* w, float eps, bool plus_one,
                  void* out, DType t) {
  constexpr const char* op = "gpu::add_rms_norm";
  check_dtype(t, op);
  KVATTN_CHECK(rows >= 0 && dim > 0, "{}: rows {} must be >= 0 and dim {} > 0", op, rows, dim);
  if (rows == 0) return;
  check_launch(kernels::add_rms_norm(x, residual, rows, dim, w, eps, plus_one, out, t), op);
}

void rope_neox(void* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride, int64_t head_stride,
               const int64_t* positions, const float* cos_table, const float* sin_table, DType t) {
  constexpr const char* op = "gpu::rope_neox";
  check_dtype(t, op);
  KVATTN_CHECK(head_dim > 0 && head_dim % 2 == 0, "{}: head_dim {} must be positive and even (neox rotates halves)",
               op, head_dim);
  KVATTN_CHECK(tokens >= 0 && heads >= 0, "{}: tokens {} and heads {} must be >= 0", op, tokens, heads);
  if (tokens == 0 || heads == 0) return;
  KVATTN_CHECK(head_stride >= head_dim, "{}: head_stride {} must be >= head_dim {}", op, head_stride, head_dim);
  KVATTN_CHECK(token_stride >= (heads - 1) * head_stride + head_dim,
               "{}: token_stride {} is smaller than the span of a token's {} heads ({} elements)", op, token_stride,
               heads, (heads - 1) * head_stride + head_dim);
  check_launch(
      kernels::rope_neox(x, tokens, heads, head_dim, token_stride, head_stride, positions, cos_table, sin_table, t), op);
}

void act_mul(const void* gate_up, int64_t tokens, int64_t inter, GatedActivation act, void* out, DType t) {
  constexpr const char* op = "gpu::act_mul";
  check_dtype(t, op);
  KVATTN_CHECK(tokens >= 0 && inter > 0, "{}: tokens {} must be >= 0 and inter {} > 0", op, tokens, inter);
  KVATTN_CHECK(act == GatedActivation::silu || act == GatedActivation::gelu_tanh,
               "{}: unknown activation {}; valid: silu, gelu_tanh", op, static_cast<int>(act));
  if (tokens == 0) return;
  check_launch(kernels::act_mul(gate_up, tokens, inter, act, out, t), op);
}

void add_inplace(void* y, const void* x, int64_t n, DType t) {
  constexpr const char* op = "gpu::add_inplace";
  check_dtype(t, op);
  KVATTN_CHECK(n >= 0, "{}: n {} must be >= 0", op, n);
  if (n == 0) return;
  check_launch(kernels::add_inplace(y, x, n, t), op);
}

void soft_cap(void* x, int64_t n, float cap, DType t) {
  constexpr const char* op = "gpu::soft_cap";
  check_dtype(t, op);
  KVATTN_CHECK(n >= 0, "{}: n {} must be >= 0", op, n);
  KVATTN_CHECK(cap > 0 && std::isfinite(cap), "{}: cap {} must be positive and finite", op, cap);
  if (n == 0) return;
  check_launch(kernels::soft_cap(x, n, cap, t), op);
}

void gather_rows(const void* x, int64_t dim, const int64_t* rows, int64_t n, void* out, DType t) {
  constexpr const char* op = "gpu::gather_rows";
  KVATTN_CHECK(dim > 0 && n >= 0, "{}: dim {} must be > 0 and n {} >= 0", op, dim, n);
  if (n == 0) return;
  check_launch(kernels::gather_rows(x, dim * dtype_size(t), rows, n, out), op);
}

void convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n) {
  constexpr const char* op = "gpu::convert";
  check_dtype(src_t, op);
  check_dtype(dst_t, op);
  KVATTN_CHECK(n >= 0, "{}: n {} must be >= 0", op, n);
  if (n == 0) return;
  check_launch(kernels::convert(src, src_t, dst, dst_t, n), op);
}

}  // namespace kvattn::model::gpu
