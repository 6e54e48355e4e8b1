// The CUDA model ops (src/model/cuda/device_ops.h) against the CPU path (cpu_math.h) on random
// inputs: every op in f32, bf16 and f16, odd sizes (rows 1, 3, 37; dims 64, 96, 128, 4544),
// strided rows.  Inputs are rounded to the dtype before both sides see them; output buffers are
// poisoned with NaN first and in-place buffers carry a sentinel (2048) in their padding, and
// every element outside the written region must come back unchanged.
//
// Tolerances (per element, `ref` the CPU result rounded to the dtype):
//   * f32: |got - ref| <= 1e-5 * max(|ref|, s), s the magnitude of the terms that cancel in
//     the element (0 where nothing cancels), so the bound is relative to what was computed.
//   * bf16 / f16: |got - ref| <= one ulp of the dtype at max(|got|, |ref|) + 1e-5 * s: both
//     sides round an f32 value that agrees to a few f32 ulps (of s where terms cancel), so
//     they differ by at most one step of the dtype.
// GEMMs: f32 (pedantic) against cpu::linear: 1e-5 * max(|ref|, sum |x w|); bf16 / f16 inputs
// against a double reference of the rounded inputs: 1e-5 * sum |x w| (f32 accumulation), plus
// one ulp of the output dtype when the output is bf16 / f16.
// Skips when no GPU is present (the argument checks, which never reach the GPU, still run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/dtype.h"
#include "kvattn/core/error.h"
#include "model/cpu_math.h"
#include "model/cuda/device_ops.h"

namespace kvattn::model {
namespace {

constexpr DType kDTypes[] = {DType::f32, DType::bf16, DType::f16};
constexpr float kSentinel = 2048.0f;  // exact in every dtype
const float kNaN = std::numeric_limits<float>::quiet_NaN();

float round_to(float v, DType t) {
  switch (t) {
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(v));
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(v));
    default: return v;
  }
}
std::vector<float> rounded(std::vector<float> v, DType t) {
  for (float& x : v) x = round_to(x, t);
  return v;
}

std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> b(v.size() * static_cast<size_t>(dtype_size(t)));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&b[i * 4], &v[i], 4);
    } else {
      const uint16_t h = t == DType::bf16 ? f32_to_bf16_bits(v[i]) : f32_to_f16_bits(v[i]);
      std::memcpy(&b[i * 2], &h, 2);
    }
  }
  return b;
}
std::vector<float> decode(const std::vector<uint8_t>& b, DType t) {
  const size_t n = b.size() / static_cast<size_t>(dtype_size(t));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::f32) {
      std::memcpy(&v[i], &b[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      v[i] = t == DType::bf16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
    }
  }
  return v;
}

// A device buffer (freed on scope exit).
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t b) : bytes(b) { p = cuda::malloc(std::max<size_t>(b, 16), 0); }
  ~Dev() {
    if (p) cuda::free(p, 0);
  }
  Dev(Dev&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class X>
  X* as() const {
    return static_cast<X*>(p);
  }
};
Dev upload_bytes(const void* src, size_t bytes) {
  Dev d(bytes);
  if (bytes) cuda::memcpy(d.p, src, bytes);
  return d;
}
Dev upload(const std::vector<float>& v, DType t) {
  const auto b = encode(v, t);
  return upload_bytes(b.data(), b.size());
}
template <class X>
Dev upload_raw(const std::vector<X>& v) {
  return upload_bytes(v.data(), v.size() * sizeof(X));
}
std::vector<float> download(const Dev& d, size_t n, DType t) {
  std::vector<uint8_t> b(n * static_cast<size_t>(dtype_size(t)));
  cuda::synchronize();
  if (!b.empty()) cuda::memcpy(b.data(), d.p, b.size());
  return decode(b, t);
}

std::vector<float> uniform(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// One unit in the last place of dtype t at magnitude m.
double ulp(double m, DType t) {
  const int mant = t == DType::bf16 ? 7 : t == DType::f16 ? 10 : 23;
  const int min_exp = t == DType::f16 ? -14 : -126;
  const int e = m > 0 ? std::max(static_cast<int>(std::floor(std::log2(m))), min_exp) : min_exp;
  return std::ldexp(1.0, e - mant);
}

// got vs ref element by element (see the file comment); a NaN in ref means "must be NaN".
// scale: the per-element cancellation magnitude (empty: none).
::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& ref, DType t,
                                     const std::vector<float>& scale = {}) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << ref.size();
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < ref.size(); ++i) {
    bool ok;
    if (std::isnan(ref[i])) {
      ok = std::isnan(got[i]);
    } else if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) {
      ok = got[i] == ref[i];
    } else {
      const double s = scale.empty() ? 0.0 : scale[i];
      const double tol = t == DType::f32 ? 1e-5 * std::max<double>(std::fabs(ref[i]), s)
                                         : ulp(std::max(std::fabs(got[i]), std::fabs(ref[i])), t) + 1e-5 * s;
      ok = std::fabs(double(got[i]) - double(ref[i])) <= tol;
    }
    if (!ok && bad++ == 0)
      first = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", expected " +
              std::to_string(ref[i]);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << ref.size() << " elements differ (" << dtype_name(t)
                                       << "); first: " << first;
}

class CudaModelOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  }
};

const int64_t kRows[] = {1, 3, 37};
// 37: rows that are no multiple of a 16-byte vector (the kernels' element-wise path)
const int64_t kDims[] = {64, 128, 96, 4544, 37};
const int64_t kHeadDims[] = {64, 128, 96, 4544};

// ---- embedding -----------------------------------------------------------------------------

TEST_F(CudaModelOps, EmbeddingMatchesCpu) {
  std::mt19937 rng(1);
  for (DType t : kDTypes)
    for (int64_t tokens : kRows)
      for (int64_t hidden : kDims) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " tokens " << tokens << " hidden " << hidden);
        const int64_t vocab = 50, pad = 7;
        const float scale = std::sqrt(static_cast<float>(hidden));  // Gemma's normaliser
        const auto table = rounded(uniform(size_t(vocab * hidden), rng, -1, 1), t);
        std::vector<int32_t> ids(static_cast<size_t>(tokens));
        for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
        Dev d_table = upload(table, t), d_ids = upload_raw(ids);
        Dev d_out = upload(std::vector<float>(size_t(tokens * hidden + pad), kNaN), t);
        gpu::embedding(d_ids.as<int32_t>(), tokens, d_table.p, hidden, scale, d_out.p, t);
        std::vector<float> ref(size_t(tokens * hidden + pad), kNaN);
        for (int64_t i = 0; i < tokens; ++i)
          std::copy_n(table.begin() + ids[size_t(i)] * hidden, hidden, ref.begin() + i * hidden);
        cpu::scale_inplace(ref.data(), tokens * hidden, scale);
        ref = rounded(ref, t);
        EXPECT_TRUE(all_close(download(d_out, ref.size(), t), ref, t));
      }
}

// ---- RMSNorm -------------------------------------------------------------------------------

TEST_F(CudaModelOps, RmsNormMatchesCpuStridedAndInPlace) {
  std::mt19937 rng(2);
  for (DType t : kDTypes)
    for (int64_t rows : kRows)
      for (int64_t dim : kDims)
        for (bool plus_one : {false, true})
          for (bool in_place : {false, true})
            for (int64_t extra : {5, 8}) {  // 8: 16-byte aligned rows (the vector path)
              SCOPED_TRACE(::testing::Message() << dtype_name(t) << " rows " << rows << " dim " << dim << " plus_one "
                                                << plus_one << " in_place " << in_place << " stride +" << extra);
              const int64_t xs = dim + extra, os = in_place ? xs : dim + 2 * extra + 1 + (extra == 8 ? 7 : 0);
              const float eps = 1e-6f;
              std::vector<float> x(size_t(rows * xs), kSentinel);
              for (int64_t r = 0; r < rows; ++r) {
                const auto v = uniform(size_t(dim), rng, -2, 2);
                std::copy(v.begin(), v.end(), x.begin() + r * xs);
              }
              x = rounded(x, t);
              const auto w = rounded(uniform(size_t(dim), rng, plus_one ? -0.5f : 0.5f, 1.5f), t);
              Dev d_x = upload(x, t), d_w = upload(w, t);
              Dev d_out(in_place ? 0 : size_t(rows * os * dtype_size(t)));
              std::vector<float> ref;
              if (in_place) {
                ref = x;
              } else {
                ref.assign(size_t(rows * os), kNaN);
                const auto poison = encode(ref, t);
                cuda::memcpy(d_out.p, poison.data(), poison.size());
              }
              for (int64_t r = 0; r < rows; ++r)
                cpu::rms_norm(x.data() + r * xs, 1, dim, dim, w.data(), eps, plus_one, ref.data() + r * os);
              ref = rounded(ref, t);
              void* out = in_place ? d_x.p : d_out.p;
              gpu::rms_norm(d_x.p, rows, dim, xs, d_w.p, eps, plus_one, out, os, t);
              EXPECT_TRUE(all_close(download(in_place ? d_x : d_out, ref.size(), t), ref, t));
            }
}

TEST_F(CudaModelOps, AddRmsNormMatchesCpu) {
  std::mt19937 rng(3);
  for (DType t : kDTypes)
    for (int64_t rows : kRows)
      for (int64_t dim : kDims)
        for (bool plus_one : {false, true})
          for (bool out_is_x : {false, true}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(t) << " rows " << rows << " dim " << dim << " plus_one "
                                              << plus_one << " out_is_x " << out_is_x);
            const int64_t n = rows * dim, pad = 9;
            const float eps = 1e-5f;
            auto x = rounded(uniform(size_t(n), rng, -2, 2), t);
            auto res = rounded(uniform(size_t(n), rng, -4, 4), t);
            x.resize(size_t(n + pad), kSentinel);
            res.resize(size_t(n + pad), kSentinel);
            const auto w = rounded(uniform(size_t(dim), rng, 0.5f, 1.5f), t);
            Dev d_x = upload(x, t), d_res = upload(res, t), d_w = upload(w, t);
            Dev d_out = upload(std::vector<float>(size_t(n + pad), kNaN), t);
            // reference: residual += x (rounded), out = rms_norm(residual)
            std::vector<float> ref_res = res;
            for (int64_t i = 0; i < n; ++i) ref_res[size_t(i)] = round_to(res[size_t(i)] + x[size_t(i)], t);
            std::vector<float> ref_out(size_t(n + pad), out_is_x ? kSentinel : kNaN);
            cpu::rms_norm(ref_res.data(), rows, dim, dim, w.data(), eps, plus_one, ref_out.data());
            ref_out = rounded(ref_out, t);
            void* out = out_is_x ? d_x.p : d_out.p;
            gpu::add_rms_norm(d_x.p, d_res.p, rows, dim, d_w.p, eps, plus_one, out, t);
            EXPECT_TRUE(all_close(download(d_res, ref_res.size(), t), ref_res, t)) << "residual";
            EXPECT_TRUE(all_close(download(out_is_x ? d_x : d_out, ref_out.size(), t), ref_out, t)) << "out";
          }
}

// ---- rotary embedding ----------------------------------------------------------------------

TEST_F(CudaModelOps, RopeNeoxMatchesCpuStrided) {
  std::mt19937 rng(4);
  for (DType t : kDTypes)
    for (int64_t tokens : kRows)
      for (int64_t head_dim : kHeadDims)
        for (int64_t heads : {1, 3}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " tokens " << tokens << " head_dim " << head_dim
                                            << " heads " << heads);
          const int64_t half = head_dim / 2, hs = head_dim + 6, ts = heads * hs + 10, max_pos = 97;
          std::vector<float> cos_t(size_t(max_pos * half)), sin_t(size_t(max_pos * half));
          for (int64_t p = 0; p < max_pos; ++p)
            for (int64_t i = 0; i < half; ++i) {
              const double ang = double(p) * std::pow(10000.0, -2.0 * double(i) / double(head_dim));
              cos_t[size_t(p * half + i)] = static_cast<float>(std::cos(ang));
              sin_t[size_t(p * half + i)] = static_cast<float>(std::sin(ang));
            }
          std::vector<int64_t> pos(static_cast<size_t>(tokens));
          for (auto& p : pos) p = static_cast<int64_t>(rng() % max_pos);
          std::vector<float> x(size_t(tokens * ts), kSentinel);
          for (int64_t i = 0; i < tokens; ++i)
            for (int64_t h = 0; h < heads; ++h) {
              const auto v = uniform(size_t(head_dim), rng, -3, 3);
              std::copy(v.begin(), v.end(), x.begin() + i * ts + h * hs);
            }
          x = rounded(x, t);
          // per-token cos / sin rows for the CPU function, and the cancellation scale |a c| + |b s|
          std::vector<float> c(size_t(tokens * half)), s(size_t(tokens * half)), scale(x.size(), 0.0f);
          for (int64_t i = 0; i < tokens; ++i)
            for (int64_t j = 0; j < half; ++j) {
              c[size_t(i * half + j)] = cos_t[size_t(pos[size_t(i)] * half + j)];
              s[size_t(i * half + j)] = sin_t[size_t(pos[size_t(i)] * half + j)];
              for (int64_t h = 0; h < heads; ++h) {
                const size_t a = size_t(i * ts + h * hs + j), b = a + size_t(half);
                const float m = std::fabs(x[a]) + std::fabs(x[b]);
                scale[a] = scale[b] = m;
              }
            }
          std::vector<float> ref = x;
          cpu::rope_neox(ref.data(), tokens, heads, head_dim, ts, hs, c.data(), s.data());
          ref = rounded(ref, t);
          Dev d_x = upload(x, t), d_pos = upload_raw(pos), d_cos = upload_raw(cos_t), d_sin = upload_raw(sin_t);
          gpu::rope_neox(d_x.p, tokens, heads, head_dim, ts, hs, d_pos.as<int64_t>(), d_cos.as<float>(),
                         d_sin.as<float>(), t);
          EXPECT_TRUE(all_close(download(d_x, ref.size(), t), ref, t, scale));
        }
}

// ---- activation · up -----------------------------------------------------------------------

TEST_F(CudaModelOps, ActMulMatchesCpuSiluAndGeluTanh) {
  std::mt19937 rng(5);
  for (DType t : kDTypes)
    for (int64_t tokens : kRows)
      for (int64_t inter : kDims)
        for (gpu::GatedActivation act : {gpu::GatedActivation::silu, gpu::GatedActivation::gelu_tanh}) {
          const bool silu = act == gpu::GatedActivation::silu;
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " tokens " << tokens << " inter " << inter
                                            << (silu ? " silu" : " gelu_tanh"));
          const int64_t pad = 5;
          const auto gu = rounded(uniform(size_t(tokens * 2 * inter), rng, -6, 6), t);
          std::vector<float> ref(size_t(tokens * inter + pad), kNaN), scale(ref.size(), 0.0f);
          (silu ? cpu::silu_mul : cpu::gelu_tanh_mul)(gu.data(), tokens, inter, ref.data());
          ref = rounded(ref, t);
          // gelu's 1 + tanh(..) cancels for negative gates: the scale is |0.5 g u|
          for (int64_t i = 0; i < tokens; ++i)
            for (int64_t j = 0; j < inter; ++j)
              scale[size_t(i * inter + j)] =
                  silu ? 0.0f : 0.5f * std::fabs(gu[size_t(i * 2 * inter + j)] * gu[size_t(i * 2 * inter + inter + j)]);
          Dev d_gu = upload(gu, t), d_out = upload(std::vector<float>(ref.size(), kNaN), t);
          gpu::act_mul(d_gu.p, tokens, inter, act, d_out.p, t);
          EXPECT_TRUE(all_close(download(d_out, ref.size(), t), ref, t, scale));
        }
}

// ---- element-wise --------------------------------------------------------------------------

TEST_F(CudaModelOps, AddInplaceMatchesCpu) {
  std::mt19937 rng(6);
  for (DType t : kDTypes)
    for (int64_t rows : kRows)
      for (int64_t dim : kDims) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n " << rows * dim);
        const int64_t n = rows * dim + (rows == 3 ? 1 : 0), pad = 6;  // an odd n too
        auto y = rounded(uniform(size_t(n), rng, -3, 3), t), x = rounded(uniform(size_t(n), rng, -3, 3), t);
        y.resize(size_t(n + pad), kSentinel);
        x.resize(size_t(n + pad), 1.0f);
        std::vector<float> ref = y, scale(ref.size(), 0.0f);
        cpu::add_inplace(ref.data(), x.data(), n);
        ref = rounded(ref, t);
        for (int64_t i = 0; i < n; ++i) scale[size_t(i)] = std::fabs(y[size_t(i)]) + std::fabs(x[size_t(i)]);
        Dev d_y = upload(y, t), d_x = upload(x, t);
        gpu::add_inplace(d_y.p, d_x.p, n, t);
        EXPECT_TRUE(all_close(download(d_y, ref.size(), t), ref, t, scale));
      }
}

TEST_F(CudaModelOps, SoftCapMatchesCpu) {
  std::mt19937 rng(7);
  for (DType t : kDTypes)
    for (int64_t rows : kRows)
      for (int64_t dim : kDims)
        for (float cap : {30.0f, 50.0f}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n " << rows * dim << " cap " << cap);
          const int64_t n = rows * dim, pad = 3;
          auto x = rounded(uniform(size_t(n), rng, -150, 150), t);
          x.resize(size_t(n + pad), kSentinel);
          std::vector<float> ref = x;
          cpu::soft_cap(ref.data(), n, cap);
          ref = rounded(ref, t);
          Dev d_x = upload(x, t);
          gpu::soft_cap(d_x.p, n, cap, t);
          EXPECT_TRUE(all_close(download(d_x, ref.size(), t), ref, t));
        }
}

// ---- gather / convert ----------------------------------------------------------------------

TEST_F(CudaModelOps, GatherRowsCopiesRowsExactly) {
  std::mt19937 rng(8);
  for (DType t : kDTypes)
    for (int64_t dim : {int64_t(1), int64_t(3), int64_t(64), int64_t(96), int64_t(4544)})
      for (int64_t n : kRows) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " dim " << dim << " n " << n);
        const int64_t src_rows = 41, pad = 4;
        const auto x = rounded(uniform(size_t(src_rows * dim), rng, -5, 5), t);
        std::vector<int64_t> rows(static_cast<size_t>(n));
        for (auto& r : rows) r = static_cast<int64_t>(rng() % src_rows);
        std::vector<float> ref(size_t(n * dim + pad), kNaN);
        for (int64_t i = 0; i < n; ++i) std::copy_n(x.begin() + rows[size_t(i)] * dim, dim, ref.begin() + i * dim);
        Dev d_x = upload(x, t), d_rows = upload_raw(rows), d_out = upload(std::vector<float>(ref.size(), kNaN), t);
        gpu::gather_rows(d_x.p, dim, d_rows.as<int64_t>(), n, d_out.p, t);
        const auto got = download(d_out, ref.size(), t);
        for (size_t i = 0; i < ref.size(); ++i)
          ASSERT_TRUE(std::isnan(ref[i]) ? std::isnan(got[i]) : got[i] == ref[i]) << "element " << i;
      }
}

TEST_F(CudaModelOps, ConvertRoundsToNearestEvenEveryPair) {
  std::mt19937 rng(9);
  // random values over a wide range, ties of both 16-bit formats, overflow to inf, signed zero
  std::vector<float> src = uniform(4544 + 37, rng, -70000, 70000);
  const auto small = uniform(1000, rng, -1e-3f, 1e-3f);
  src.insert(src.end(), small.begin(), small.end());
  for (float v : {0.0f, -0.0f, 1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),
                  1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11), 65520.0f, -65504.0f, 1e-8f,
                  std::numeric_limits<float>::infinity()})
    src.push_back(v);
  for (DType from : kDTypes)
    for (DType to : kDTypes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(from) << " -> " << dtype_name(to));
      const auto in = rounded(src, from);
      const int64_t n = static_cast<int64_t>(in.size()), pad = 5;
      std::vector<float> ref = rounded(in, to);
      ref.resize(size_t(n + pad), kNaN);
      Dev d_in = upload(in, from), d_out = upload(std::vector<float>(ref.size(), kNaN), to);
      gpu::convert(d_in.p, from, d_out.p, to, n);
      const auto out_bytes = [&] {
        std::vector<uint8_t> b(ref.size() * size_t(dtype_size(to)));
        cuda::synchronize();
        cuda::memcpy(b.data(), d_out.p, b.size());
        return b;
      }();
      const auto ref_bytes = encode(ref, to);
      // bitwise (signed zeros included) over the converted elements; padding stays NaN
      EXPECT_EQ(0, std::memcmp(out_bytes.data(), ref_bytes.data(), size_t(n * dtype_size(to))));
      const auto got = decode(out_bytes, to);
      for (size_t i = size_t(n); i < got.size(); ++i) EXPECT_TRUE(std::isnan(got[i])) << "padding " << i;
    }
}

// ---- GEMM ----------------------------------------------------------------------------------

struct GemmShape {
  int64_t K, N;
};
const GemmShape kGemmShapes[] = {{96, 200}, {200, 1000}, {1000, 96}};
const int64_t kGemmRows[] = {1, 2, 3, 17, 128};

TEST_F(CudaModelOps, GemmF32PedanticMatchesCpuLinear) {
  std::mt19937 rng(10);
  gpu::Gemm gemm;
  for (const GemmShape& sh : kGemmShapes)
    for (int64_t M : kGemmRows)
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "M " << M << " K " << sh.K << " N " << sh.N << " bias " << with_bias);
        const int64_t K = sh.K, N = sh.N, ldx = K + 5, ldy = N + 3;
        std::vector<float> x(size_t(M * ldx), kSentinel);
        for (int64_t m = 0; m < M; ++m) {
          const auto v = uniform(size_t(K), rng, -1, 1);
          std::copy(v.begin(), v.end(), x.begin() + m * ldx);
        }
        const auto w = uniform(size_t(N * K), rng, -1, 1), bias = uniform(size_t(N), rng, -1, 1);
        std::vector<float> ref(size_t(M * ldy), kNaN), scale(ref.size(), 0.0f);
        cpu::linear(x.data(), M, K, ldx, w.data(), N, with_bias ? bias.data() : nullptr, ref.data(), ldy);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double s = with_bias ? std::fabs(bias[size_t(n)]) : 0.0;
            for (int64_t k = 0; k < K; ++k) s += std::fabs(x[size_t(m * ldx + k)] * w[size_t(n * K + k)]);
            scale[size_t(m * ldy + n)] = static_cast<float>(s);
          }
        Dev d_x = upload(x, DType::f32), d_w = upload(w, DType::f32), d_b = upload(bias, DType::f32);
        Dev d_y = upload(std::vector<float>(ref.size(), kNaN), DType::f32);
        gemm.linear(d_x.p, M, K, ldx, d_w.p, N, with_bias ? d_b.p : nullptr, d_y.p, ldy, DType::f32, DType::f32);
        EXPECT_TRUE(all_close(download(d_y, ref.size(), DType::f32), ref, DType::f32, scale));
      }
}

TEST_F(CudaModelOps, GemmHalfInputsMatchDoubleReference) {
  std::mt19937 rng(11);
  gpu::Gemm gemm;
  for (DType in_t : {DType::bf16, DType::f16})
    for (DType out_t : {in_t, DType::f32})
      for (const GemmShape& sh : kGemmShapes)
        for (int64_t M : kGemmRows)
          for (bool with_bias : {false, true}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(in_t) << " -> " << dtype_name(out_t) << " M " << M
                                              << " K " << sh.K << " N " << sh.N << " bias " << with_bias);
            const int64_t K = sh.K, N = sh.N, ldx = K + 5, ldy = N + 3;
            std::vector<float> x(size_t(M * ldx), kSentinel);
            for (int64_t m = 0; m < M; ++m) {
              const auto v = uniform(size_t(K), rng, -1, 1);
              std::copy(v.begin(), v.end(), x.begin() + m * ldx);
            }
            x = rounded(x, in_t);
            const auto w = rounded(uniform(size_t(N * K), rng, -1, 1), in_t);
            const auto bias = rounded(uniform(size_t(N), rng, -1, 1), out_t);
            // double reference; tolerance 1e-5 * sum |x w| (+ one output ulp for 16-bit outputs)
            std::vector<float> ref(size_t(M * ldy), kNaN);
            std::vector<double> tol(ref.size(), 0.0);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n) {
                double acc = with_bias ? bias[size_t(n)] : 0.0, s = with_bias ? std::fabs(bias[size_t(n)]) : 0.0;
                for (int64_t k = 0; k < K; ++k) {
                  const double p = double(x[size_t(m * ldx + k)]) * double(w[size_t(n * K + k)]);
                  acc += p;
                  s += std::fabs(p);
                }
                ref[size_t(m * ldy + n)] = static_cast<float>(acc);
                tol[size_t(m * ldy + n)] = 1e-5 * s + (out_t == DType::f32 ? 0.0 : ulp(std::fabs(acc), out_t));
              }
            Dev d_x = upload(x, in_t), d_w = upload(w, in_t), d_b = upload(bias, out_t);
            Dev d_y = upload(std::vector<float>(ref.size(), kNaN), out_t);
            gemm.linear(d_x.p, M, K, ldx, d_w.p, N, with_bias ? d_b.p : nullptr, d_y.p, ldy, in_t, out_t);
            const auto got = download(d_y, ref.size(), out_t);
            int64_t bad = 0;
            for (size_t i = 0; i < ref.size(); ++i) {
              const bool ok = std::isnan(ref[i]) ? std::isnan(got[i])
                                                 : std::fabs(double(got[i]) - double(ref[i])) <= tol[i];
              if (!ok && bad++ < 3)
                ADD_FAILURE() << "element " << i << ": got " << got[i] << ", expected " << ref[i] << " (tolerance "
                              << tol[i] << ")";
            }
            EXPECT_EQ(bad, 0);
          }
}

TEST_F(CudaModelOps, GemmRejectsBadArguments) {
  gpu::Gemm gemm;
  int dummy = 0;
  void* p = &dummy;
  EXPECT_THROW(gemm.linear(p, 2, 8, 8, p, 4, nullptr, p, 4, DType::bf16, DType::f16), InvalidArgument);
  EXPECT_THROW(gemm.linear(p, 2, 8, 8, p, 4, nullptr, p, 4, DType::f32, DType::bf16), InvalidArgument);
  EXPECT_THROW(gemm.linear(p, 2, 8, 8, p, 4, nullptr, p, 4, DType::i32, DType::i32), InvalidArgument);
  EXPECT_THROW(gemm.linear(p, 2, 8, 7, p, 4, nullptr, p, 4, DType::f32, DType::f32), InvalidArgument);  // ldx < K
  EXPECT_THROW(gemm.linear(p, 2, 8, 8, p, 4, nullptr, p, 3, DType::f32, DType::f32), InvalidArgument);  // ldy < N
  EXPECT_THROW(gemm.linear(p, -1, 8, 8, p, 4, nullptr, p, 4, DType::f32, DType::f32), InvalidArgument);
  // an empty product is a no-op
  EXPECT_NO_THROW(gemm.linear(nullptr, 0, 8, 8, nullptr, 4, nullptr, nullptr, 4, DType::f32, DType::f32));
}

// The argument checks come before any CUDA call, so they run without a GPU too.
TEST(CudaModelOpsArguments, RejectBadSizesAndDTypes) {
  int dummy = 0;
  void* p = &dummy;
  const int64_t pos = 0;
  const float f = 0;
  EXPECT_THROW(gpu::rope_neox(p, 1, 1, 63, 63, 63, &pos, &f, &f, DType::f32), InvalidArgument);  // odd head_dim
  EXPECT_THROW(gpu::rope_neox(p, 1, 2, 64, 100, 64, &pos, &f, &f, DType::f32), InvalidArgument);  // heads overlap
  EXPECT_THROW(gpu::rope_neox(p, 1, 1, 64, 64, 32, &pos, &f, &f, DType::f32), InvalidArgument);   // head_stride
  EXPECT_THROW(gpu::add_inplace(p, p, -1, DType::f32), InvalidArgument);
  EXPECT_THROW(gpu::soft_cap(p, -1, 30.0f, DType::bf16), InvalidArgument);
  EXPECT_THROW(gpu::soft_cap(p, 4, 0.0f, DType::bf16), InvalidArgument);
  EXPECT_THROW(gpu::rms_norm(p, 1, 64, 32, p, 1e-6f, false, p, 64, DType::f32), InvalidArgument);  // stride < dim
  EXPECT_THROW(gpu::rms_norm(p, 1, 64, 64, p, 1e-6f, false, p, 64, DType::i32), InvalidArgument);
  EXPECT_THROW(gpu::rms_norm(p, 1, 64, 64, p, 1e-6f, false, p, 80, DType::f32), InvalidArgument);  // in place, strides
  EXPECT_THROW(gpu::add_rms_norm(p, p, -1, 64, p, 1e-6f, false, p, DType::f16), InvalidArgument);
  EXPECT_THROW(gpu::act_mul(p, 1, 0, gpu::GatedActivation::silu, p, DType::f32), InvalidArgument);
  EXPECT_THROW(gpu::embedding(nullptr, -1, p, 64, 1.0f, p, DType::f32), InvalidArgument);
  EXPECT_THROW(gpu::embedding(nullptr, 1, p, 64, 1.0f, p, DType::fp8_e4m3), InvalidArgument);
  EXPECT_THROW(gpu::gather_rows(p, 0, nullptr, 1, p, DType::f32), InvalidArgument);
  EXPECT_THROW(gpu::convert(p, DType::f32, p, DType::fp8_e4m3, 4), InvalidArgument);
  EXPECT_THROW(gpu::convert(p, DType::f32, p, DType::f16, -2), InvalidArgument);
  // empty calls are no-ops (no launch)
  EXPECT_NO_THROW(gpu::add_inplace(nullptr, nullptr, 0, DType::f32));
  EXPECT_NO_THROW(gpu::rms_norm(nullptr, 0, 64, 64, nullptr, 1e-6f, false, nullptr, 64, DType::bf16));
}

}  // namespace
}  // namespace kvattn::model
