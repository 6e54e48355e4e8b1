// src/ops/cuda/dcp_ops.cu — the strided copy and the DCP LSE combines (see
// include/kvattn/ops/dcp_combine.h for the semantics; src/ops/dcp_combine.cpp has the CPU
// versions the tests compare against).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/dcp_kernels.h"

#include <cmath>

namespace kvattn::ops::cuda_impl::k {
namespace {

// ---- strided copy --------------------------------------------------------------------------
__device__ __forceinline__ void offsets_of(const CopyParams& p, int64_t i, int64_t& so, int64_t& dof) {
  so = 0;
  dof = 0;
  for (int d = p.ndim - 1; d >= 0; --d) {
    const int64_t n = p.shape[d];
    const int64_t q = i / n, c = i - q * n;
    so += c * p.src_stride[d];
    dof += c * p.dst_stride[d];
    i = q;
  }
}

template <typename U>
__global__ void copy_raw(CopyParams p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.numel; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t so, dof;
    offsets_of(p, i, so, dof);
    static_cast<U*>(p.dst)[dof] = static_cast<const U*>(p.src)[so];
  }
}

__global__ void copy_convert(CopyParams p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.numel; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t so, dof;
    offsets_of(p, i, so, dof);
    store_elt(p.dst, dof, p.dst_elt, load_elt(p.src, so, p.src_elt) * p.scale);
  }
}

// ---- LSE helpers -----------------------------------------------------------------------------
__device__ __forceinline__ bool bad_lse(float v) { return isnan(v) || isinf(v); }
__device__ __forceinline__ float lexp(float x, bool e) { return e ? expf(x) : exp2f(x); }
__device__ __forceinline__ float llog(float x, bool e) { return e ? logf(x) : log2f(x); }

// Global LSE of W values lse(r) = p[r * stride], computed by a whole warp (any W).
__device__ __forceinline__ float warp_global_lse(const float* p, int64_t W, int64_t stride, bool e) {
  const int lane = threadIdx.x & 31;
  float m = -INFINITY;
  for (int64_t r = lane; r < W; r += 32) {
    const float v = p[r * stride];
    if (!bad_lse(v)) m = fmaxf(m, v);
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (m == -INFINITY) return -INFINITY;
  float s = 0.f;
  for (int64_t r = lane; r < W; r += 32) {
    const float v = p[r * stride];
    if (!bad_lse(v)) s += lexp(v - m, e);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return m + llog(s, e);
}

__device__ __forceinline__ float lse_weight(float lse, float g, bool e) {
  return (g == -INFINITY || bad_lse(lse)) ? 0.f : lexp(lse - g, e);
}

constexpr int kWarpsPerBlock = 8;

__global__ void scale_pack_kernel(DcpScalePackParams p) {
  const int64_t WH = p.W * p.H;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (row >= p.T * WH) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = row / WH, hw = row - t * WH;
  const float g = warp_global_lse(p.all_lse + t * WH + hw, p.W, p.T * WH, p.base_e);
  if (p.global_lse && lane == 0) p.global_lse[t * p.g_st + hw * p.g_sh] = g;
  const float f = lse_weight(p.all_lse[(p.rank * p.T + t) * WH + hw], g, p.base_e);
  const int64_t w = hw / p.H, h = hw - w * p.H;
  float* dst = p.packed + ((w * p.T + t) * p.H + h) * p.D;
  const int64_t src0 = t * p.p_st + hw * p.p_sh;
  for (int64_t d = lane; d < p.D; d += 32)
    dst[d] = f == 0.f ? 0.f : f * load_elt(p.partial, src0 + d * p.p_sd, p.partial_elt);
}

__global__ void combine_kernel(DcpCombineParams p) {
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (row >= p.T * p.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = row / p.H, h = row - t * p.H;
  const float* l = p.lses + t * p.l_st + h * p.l_sh;
  const float g = warp_global_lse(l, p.W, p.l_sw, p.base_e);
  if (p.global_lse && lane == 0) p.global_lse[t * p.g_st + h * p.g_sh] = g;
  const int64_t o0 = t * p.o_st + h * p.o_sh;
  for (int64_t d = lane; d < p.D; d += 32) {
    float acc = 0.f;
    for (int64_t r = 0; r < p.W; ++r) {
      const float f = lse_weight(l[r * p.l_sw], g, p.base_e);
      if (f != 0.f) acc += f * load_elt(p.partials, r * p.p_sw + t * p.p_st + h * p.p_sh + d * p.p_sd, p.partials_elt);
    }
    store_elt(p.out, o0 + d * p.o_sd, p.out_elt, acc);
  }
}

int grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65535 * 16 ? b : 65535 * 16);
}

}  // namespace

int launch_strided_copy(const CopyParams& p) {
  if (p.numel == 0) return 0;
  constexpr int threads = 256;
  const int grid = grid_for(p.numel, threads);
  switch (p.elt_bytes) {
    case 1: copy_raw<uint8_t><<<grid, threads>>>(p); break;
    case 2: copy_raw<uint16_t><<<grid, threads>>>(p); break;
    case 4: copy_raw<uint32_t><<<grid, threads>>>(p); break;
    case 8: copy_raw<uint64_t><<<grid, threads>>>(p); break;
    default: copy_convert<<<grid, threads>>>(p); break;
  }
  return static_cast<int>(cudaGetLastError());
}

int launch_dcp_lse_scale_pack(const DcpScalePackParams& p) {
  const int64_t rows = p.T * p.W * p.H;
  if (rows == 0) return 0;
  scale_pack_kernel<<<static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock>>>(p);
  return static_cast<int>(cudaGetLastError());
}

int launch_dcp_lse_combine(const DcpCombineParams& p) {
  const int64_t rows = p.T * p.H;
  if (rows == 0) return 0;
  combine_kernel<<<static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvattn::ops::cuda_impl::k
