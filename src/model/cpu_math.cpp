#include "cpu_math.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <thread>

// OpenBLAS's own entry points (declared by its cblas.h; repeated here so the netlib cblas.h,
// which lacks them, cannot silently drop thread control).
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" int openblas_get_num_threads(void);

namespace kvattn::model::cpu {

namespace {
constexpr int64_t kGemvRows = 4;  // below this many rows, linear() runs one sgemv per row
}  // namespace

void set_num_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(n);
}

int num_threads() { return openblas_get_num_threads(); }

void linear(const float* x, int64_t M, int64_t K, int64_t ldx, const float* w, int64_t N, const float* bias, float* y,
            int64_t ldy) {
  if (M == 0 || N == 0) return;
  if (bias) {
    for (int64_t m = 0; m < M; ++m) std::copy(bias, bias + N, y + m * ldy);
  }
  if (M < kGemvRows) {
    // Decode-sized steps: sgemm would pack the whole weight matrix for a few rows; a
    // matrix-vector product per row streams it once per row instead.
    for (int64_t m = 0; m < M; ++m)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(N), static_cast<blasint>(K), 1.0f, w,
                  static_cast<blasint>(K), x + m * ldx, 1, bias ? 1.0f : 0.0f, y + m * ldy, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(M), static_cast<blasint>(N),
              static_cast<blasint>(K), 1.0f, x, static_cast<blasint>(ldx), w, static_cast<blasint>(K),
              bias ? 1.0f : 0.0f, y, static_cast<blasint>(ldy));
}

void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t stride, const float* w, double eps, bool plus_one,
              float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * stride;
    float* o = out + r * stride;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    if (plus_one) {
      for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * (1.0f + w[i]);
    } else {
      for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * w[i];
    }
  }
}

void rope_neox(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride, int64_t head_stride,
               const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* a = x + t * token_stride + h * head_stride;
      float* b = a + half;
      for (int64_t i = 0; i < half; ++i) {
        const float ai = a[i], bi = b[i];
        a[i] = ai * c[i] - bi * s[i];
        b[i] = bi * c[i] + ai * s[i];
      }
    }
  }
}

void silu_mul(const float* gate_up, int64_t tokens, int64_t inter, float* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* g = gate_up + t * 2 * inter;
    const float* u = g + inter;
    float* o = out + t * inter;
    for (int64_t i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void gelu_tanh_mul(const float* gate_up, int64_t tokens, int64_t inter, float* out) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* g = gate_up + t * 2 * inter;
    const float* u = g + inter;
    float* o = out + t * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float v = g[i];
      o[i] = 0.5f * v * (1.0f + std::tanh(kC * (v + 0.044715f * v * v * v))) * u[i];
    }
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void soft_cap(float* x, int64_t n, double cap) {
  const float c = static_cast<float>(cap), inv = static_cast<float>(1.0 / cap);
  for (int64_t i = 0; i < n; ++i) x[i] = c * std::tanh(x[i] * inv);
}

}  // namespace kvattn::model::cpu
