// The attention kernel for the build's baseline instruction set.
// (8-float vectors are passed between internal-linkage helpers only, so the psABI note about
// AVX vector returns does not apply.)
#pragma GCC diagnostic ignored "-Wpsabi"
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace kvattn::ops::cpu {

#define KVATTN_KERNEL_ENTRY attention_items_generic
#define KVATTN_MERGE_ENTRY attention_merge_generic
#define kvattn_fma8(a, b, c) ((a) * (b) + (c))
#define kvattn_cvt_f16_8(p) cvt_f16_8_scalar(p)
namespace {
typedef float v8f_generic __attribute__((vector_size(32)));
inline v8f_generic cvt_f16_8_scalar(const uint16_t* p) {
  v8f_generic v;
  for (int i = 0; i < 8; ++i) v[i] = f16_bits_to_f32(p[i]);
  return v;
}
}  // namespace
#include "ops/cpu/attention_kernel_impl.h"

AttnScratch attention_scratch(int64_t rows, int64_t nt, int64_t D, int64_t TK) {
  thread_local std::vector<float> f;
  thread_local std::vector<int64_t> i64;
  thread_local std::vector<detail::RowMask> masks;
  const size_t need = static_cast<size_t>(2 * rows * D + 2 * TK * D + rows * TK + 2 * rows);
  if (f.size() < need) f.resize(need);
  if (i64.size() < static_cast<size_t>(2 * nt)) i64.resize(static_cast<size_t>(2 * nt));
  if (masks.size() < static_cast<size_t>(nt)) masks.resize(static_cast<size_t>(nt));
  AttnScratch w;
  float* p = f.data();
  w.q = p; p += rows * D;
  w.acc = p; p += rows * D;
  w.kf = p; p += TK * D;
  w.vf = p; p += TK * D;
  w.s = p; p += rows * TK;
  w.m = p; p += rows;
  w.l = p;
  w.lo = i64.data();
  w.hi = i64.data() + nt;
  w.masks = masks.data();
  return w;
}

#if !(defined(__x86_64__) || defined(_M_X64))
void attention_items_avx2(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n) {
  attention_items_generic(p, items, n);
}
void attention_merge_avx2(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n) {
  attention_merge_generic(p, items, n);
}
bool cpu_has_avx2_fma() { return false; }
void attention_items_avx512bf16(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n) {
  attention_items_generic(p, items, n);
}
void attention_merge_avx512bf16(const AttnKernelParams& p, const AttnWorkItem* items, int64_t n) {
  attention_merge_generic(p, items, n);
}
bool cpu_has_avx512bf16() { return false; }
#endif

}  // namespace kvattn::ops::cpu
