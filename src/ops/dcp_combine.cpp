// ops::copy_, ops::dcp_lse_scale_pack, ops::dcp_lse_combine: checks, the CPU versions, and
// the dispatch to CUDA (src/ops/cuda/dcp_ops.cu).
#include "kvattn/ops/dcp_combine.h"

#include <cmath>
#include <limits>
#include <vector>

#include "ops/common.h"
#include "ops/cuda_dispatch.h"

namespace kvattn::ops {
using namespace detail;

namespace {

constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

inline bool bad_lse(float v) { return std::isnan(v) || std::isinf(v); }
inline float lse_exp(float x, bool base_e) { return base_e ? std::exp(x) : std::exp2(x); }
inline float lse_log(float x, bool base_e) { return base_e ? std::log(x) : std::log2(x); }

// g over `w` values at `stride` apart (see the header for the rule).
float row_global_lse(const float* p, int64_t w, int64_t stride, bool base_e) {
  float m = kNegInfF;
  for (int64_t r = 0; r < w; ++r)
    if (!bad_lse(p[r * stride])) m = std::max(m, p[r * stride]);
  if (m == kNegInfF) return kNegInfF;
  float s = 0.f;
  for (int64_t r = 0; r < w; ++r)
    if (!bad_lse(p[r * stride])) s += lse_exp(p[r * stride] - m, base_e);
  return m + lse_log(s, base_e);
}

inline float weight(float lse, float g, bool base_e) {
  return (g == kNegInfF || bad_lse(lse)) ? 0.f : lse_exp(lse - g, base_e);
}

Tensor f32_contiguous(const Tensor& t) {
  if (t.dtype() == DType::f32 && t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), DType::f32);
  c.copy_from(t);
  return c;
}

void check_float(const Tensor& t, const char* op, const char* name) {
  check_dtype_in(t, {DType::f32, DType::f16, DType::bf16}, op, name);
}

}  // namespace

// ---- copy_ -------------------------------------------------------------------------------------
namespace {
void check_copy(const Tensor& dst, const Tensor& src, const char* op) {
  check_defined(dst, op, "dst");
  check_defined(src, op, "src");
  check_same_device(dst, src, op, "src");
  KVATTN_CHECK(dst.shape() == src.shape(), "{}: `src` has shape {} but `dst` has shape {}; they must match", op,
               src.shape().str(), dst.shape().str());
  KVATTN_CHECK(dst.dim() <= 8, "{}: at most 8 dimensions are supported, got {}", op, dst.dim());
  KVATTN_CHECK(dst.dtype() == src.dtype() || (dtype_is_float(dst.dtype()) && dtype_is_float(src.dtype())),
               "{}: cannot convert {} to {}; conversions exist between float dtypes (f32, f16, bf16, fp8) "
               "only, other dtypes must match",
               op, dtype_name(src.dtype()), dtype_name(dst.dtype()));
}
}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  check_copy(dst, src, "copy_");
  if (dst.numel() == 0) return;
  if (dst.device().is_cuda()) return cuda_impl::copy_(dst, src, 1.0f);
  Tensor(dst).copy_from(src);
}

void scaled_copy_(const Tensor& dst, const Tensor& src, float scale) {
  static constexpr const char* op = "scaled_copy_";
  check_copy(dst, src, op);
  KVATTN_CHECK(dtype_is_float(dst.dtype()) && dtype_is_float(src.dtype()),
               "{}: scaling needs float dtypes (f32, f16, bf16, fp8); got {} -> {}", op, dtype_name(src.dtype()),
               dtype_name(dst.dtype()));
  KVATTN_CHECK(std::isfinite(scale), "{}: scale must be finite, got {}", op, scale);
  if (dst.numel() == 0) return;
  if (dst.device().is_cuda()) return cuda_impl::copy_(dst, src, scale);
  Tensor f = Tensor::empty(src.shape(), DType::f32);  // contiguous f32 copy, scaled, then rounded
  f.copy_from(src);
  float* p = f.data_ptr<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] *= scale;
  Tensor(dst).copy_from(f);
}

// ---- dcp_lse_scale_pack ------------------------------------------------------------------------
void dcp_lse_scale_pack(const Tensor& partial, const Tensor& all_lse, int64_t rank, bool lse_base_e,
                        const Tensor& packed, const Tensor& global_lse) {
  static constexpr const char* op = "dcp_lse_scale_pack";
  check_defined(partial, op, "partial");
  check_dim(partial, 3, op, "partial", "[T, W*H, D]");
  check_float(partial, op, "partial");
  check_dim(all_lse, 3, op, "all_lse", "[W, T, W*H]");
  check_dtype_in(all_lse, {DType::f32}, op, "all_lse");
  check_same_device(partial, all_lse, op, "all_lse");
  const int64_t T = partial.size(0), WH = partial.size(1), D = partial.size(2), W = all_lse.size(0);
  KVATTN_CHECK(W >= 1 && WH % W == 0, "{}: {} heads in `partial` do not divide over the {} ranks of `all_lse`", op,
               WH, W);
  KVATTN_CHECK(all_lse.size(1) == T && all_lse.size(2) == WH, "{}: `all_lse` must be [W, T, W*H] = [{}, {}, {}], got {}",
               op, W, T, WH, all_lse.shape().str());
  KVATTN_CHECK(rank >= 0 && rank < W, "{}: rank {} outside [0, {})", op, rank, W);
  const int64_t H = WH / W;
  check_dim(packed, 4, op, "packed", "[W, T, H, D]");
  check_dtype_in(packed, {DType::f32}, op, "packed");
  check_same_device(partial, packed, op, "packed");
  KVATTN_CHECK(packed.shape() == Dims({W, T, H, D}) && packed.is_contiguous(),
               "{}: `packed` must be a contiguous [W, T, H, D] = [{}, {}, {}, {}] f32 tensor, got {}", op, W, T, H, D,
               packed.str());
  if (global_lse.defined()) {
    check_dim(global_lse, 2, op, "global_lse", "[T, W*H]");
    check_dtype_in(global_lse, {DType::f32}, op, "global_lse");
    check_same_device(partial, global_lse, op, "global_lse");
    KVATTN_CHECK(global_lse.size(0) == T && global_lse.size(1) == WH, "{}: `global_lse` must be [{}, {}], got {}", op,
                 T, WH, global_lse.shape().str());
  }
  if (T == 0) return;
  if (partial.device().is_cuda()) return cuda_impl::dcp_lse_scale_pack(partial, all_lse, rank, lse_base_e, packed, global_lse);

  const Tensor L = f32_contiguous(all_lse);
  const Tensor P = f32_contiguous(partial);
  const float* l = L.data_ptr<float>();
  const float* p = P.data_ptr<float>();
  float* o = packed.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hw = 0; hw < WH; ++hw) {
      const float g = row_global_lse(l + t * WH + hw, W, T * WH, lse_base_e);
      if (global_lse.defined()) global_lse.at<float>({t, hw}) = g;
      const float f = weight(l[rank * T * WH + t * WH + hw], g, lse_base_e);
      const int64_t w = hw / H, h = hw % H;
      const float* src = p + (t * WH + hw) * D;
      float* dst = o + ((w * T + t) * H + h) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = f == 0.f ? 0.f : f * src[d];  // 0, even for a NaN partial
    }
}

// ---- dcp_lse_combine ---------------------------------------------------------------------------
void dcp_lse_combine(const Tensor& partials, const Tensor& lses, bool lse_base_e, const Tensor& out,
                     const Tensor& global_lse) {
  static constexpr const char* op = "dcp_lse_combine";
  check_defined(partials, op, "partials");
  check_dim(partials, 4, op, "partials", "[W, T, H, D]");
  check_float(partials, op, "partials");
  check_dim(lses, 3, op, "lses", "[W, T, H]");
  check_dtype_in(lses, {DType::f32}, op, "lses");
  check_same_device(partials, lses, op, "lses");
  const int64_t W = partials.size(0), T = partials.size(1), H = partials.size(2), D = partials.size(3);
  KVATTN_CHECK(lses.size(0) == W && lses.size(1) == T && lses.size(2) == H,
               "{}: `lses` must be [W, T, H] = [{}, {}, {}], got {}", op, W, T, H, lses.shape().str());
  check_dim(out, 3, op, "out", "[T, H, D]");
  check_float(out, op, "out");
  check_same_device(partials, out, op, "out");
  KVATTN_CHECK(out.size(0) == T && out.size(1) == H && out.size(2) == D, "{}: `out` must be [{}, {}, {}], got {}", op,
               T, H, D, out.shape().str());
  if (global_lse.defined()) {
    check_dim(global_lse, 2, op, "global_lse", "[T, H]");
    check_dtype_in(global_lse, {DType::f32}, op, "global_lse");
    check_same_device(partials, global_lse, op, "global_lse");
    KVATTN_CHECK(global_lse.size(0) == T && global_lse.size(1) == H, "{}: `global_lse` must be [{}, {}], got {}", op,
                 T, H, global_lse.shape().str());
  }
  if (T == 0) return;
  if (partials.device().is_cuda()) return cuda_impl::dcp_lse_combine(partials, lses, lse_base_e, out, global_lse);

  const Tensor L = f32_contiguous(lses);
  const Tensor P = f32_contiguous(partials);
  const float* l = L.data_ptr<float>();
  const float* p = P.data_ptr<float>();
  Tensor acc = Tensor::zeros({T, H, D}, DType::f32);
  float* a = acc.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float g = row_global_lse(l + t * H + h, W, T * H, lse_base_e);
      if (global_lse.defined()) global_lse.at<float>({t, h}) = g;
      float* row = a + (t * H + h) * D;
      for (int64_t r = 0; r < W; ++r) {
        const float f = weight(l[(r * T + t) * H + h], g, lse_base_e);
        if (f == 0.f) continue;
        const float* src = p + ((r * T + t) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) row[d] += f * src[d];
      }
    }
  Tensor(out).copy_from(acc);
}

}  // namespace kvattn::ops
