// tools/cuda/bench_wgmma.cu — the wgmma bf16 rate ceilings of `kvattn bench-cuda`: probe
// kernels that only issue wgmma, m64n256k16 from shared memory (the ceiling printed beside the
// prefill figures) and the prefill kernel's own shapes and mix (diagnostics); sm_90a, elsewhere
// the ceilings are 0.
// Part of the kvattn tool, not of the library.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/bench_support.h"
#include "ops/cuda/ptx.cuh"
#include "ops/cuda/wgmma.cuh"

namespace kvattn::tools::cuda_bench {
namespace {
using namespace kvattn::ops::cuda_impl::k;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ int g_probe_arch = 1;  // this image holds the probe's body
// The probes' operands: the dynamic shared memory's first `bytes` from its first 1024-byte
// boundary (the 128-byte swizzle's alignment), filled with small non-zero bf16 values and made
// visible to the async proxy; returns that boundary's shared address.
__device__ __forceinline__ uint32_t probe_fill_smem(int bytes) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* sb = smem_raw + (base - raw);
  for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x)
    reinterpret_cast<__nv_bfloat16*>(sb)[i] = __float2bfloat16(0.001f * float((i * 37) % 61 - 30));
  fence_proxy_async();
  __syncthreads();
  return base;
}
// The wgmma bf16 rate probe: 2 warpgroups per CTA, each issuing m64n256k16 from a 48 KB shared
// tile (filled with small non-zero bf16 values) in groups of 8, 2 CTAs per SM; FLOPs counted
// 2 * 64 * 256 * 16 per instruction.
__global__ void __launch_bounds__(256, 1) wgmma_rate_kernel(int iters, float* sink) {
  const uint32_t base = probe_fill_smem(48 * 1024);
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
  const uint64_t da = desc_sw128(base, 16, 1024);
  const uint64_t db = desc_sw128(base + 16384, 16, 1024);
  for (int it = 0; it < iters; ++it) {
    wg_fence();
#pragma unroll
    for (int k = 0; k < 8; ++k) wgmma_ss_m64n256(d, da + (k & 3) * 2, db + (k & 3) * 2);
    wg_commit();
    wg_wait0();
  }
  reg_fence(d);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) s += d[i];
  if (s == 12345.f) sink[0] = s;  // keeps the work
}
// The prefill kernel's instruction mix (hopper_prefill.cu), its tensor work alone: 2 warpgroups
// per CTA, 1 CTA per SM (as the kernel's two consumer warpgroups), each issuing per round, from a
// 96 KB shared area laid out as the kernel's Q tile, K tile and V tile,
//   kMix 1: S = Q K^T, 8 x m64n128k16 from shared memory;
//   kMix 2: O += P V, 16 x m64n64k16 with P in registers, V N-major in two 64-column halves;
//   kMix 3: O += P V, 8 x m64n128k16 over both halves at once;
//   kMix 4: 1 then 2 (a tile of the kernel as it was);  kMix 5: 1 then 3 (as it is),
// then waiting for them (wait_group 0).  The round loop stays rolled (unroll 1): unrolled,
// ptxas inserted two wgmma fences of its own into kMix 5's loop ("warpgroup.arrive is
// injected", C7519), which the kernel does not have.
template <int kMix>
__global__ void __launch_bounds__(256, 1) wgmma_mix_kernel(int iters, float* sink) {
  const uint32_t base = probe_fill_smem(96 * 1024);
  constexpr int kHalf = 128 * 128;  // one 64-column half of a 128-row tile
  const uint32_t sq = base + (threadIdx.x / 128 & 1) * 64 * 128, sk = base + 2 * kHalf, sv = base + 4 * kHalf;
  float sacc[64], o0[32], o1[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o0[i] = o1[i] = sacc[i] = sacc[32 + i] = 0.f;
  const uint32_t pa[4] = {0x3c003c00u + threadIdx.x, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    wg_fence();
    if constexpr (kMix == 1 || kMix >= 4) {
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const uint32_t off = (ks >> 2) * kHalf + (ks & 3) * 32;
        wgmma_ss_m64n128(sacc, desc_sw128(sq + off, 16, 1024), desc_sw128(sk + off, 16, 1024), 1);
      }
    }
    if constexpr (kMix == 2 || kMix == 4) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        wgmma_rs_m64n64_tb(o0, pa, desc_sw128(sv + kk * 16 * 128, 16, 1024));
        wgmma_rs_m64n64_tb(o1, pa, desc_sw128(sv + kHalf + kk * 16 * 128, 16, 1024));
      }
    }
    if constexpr (kMix == 3 || kMix == 5) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) wgmma_rs_m64n128_tb(o0, o1, pa, desc_sw128(sv + kk * 16 * 128, kHalf, 1024));
    }
    wg_commit();
    wg_wait0();
    reg_fence(sacc);
    reg_fence(o0);
    reg_fence(o1);
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) s += sacc[i] + sacc[32 + i] + o0[i] + o1[i];
  if (s == 12345.f) sink[0] = s;  // keeps the work
}
#else
__device__ int g_probe_arch = 0;
__global__ void __launch_bounds__(256, 1) wgmma_rate_kernel(int, float*) {}
template <int kMix>
__global__ void __launch_bounds__(256, 1) wgmma_mix_kernel(int, float*) {}
#endif

// Whether the loaded image of the tool holds the probe's body (an sm_90a build on an sm_90 device).
bool probe_code_loaded() {
  int dev = 0, major = 0, minor = 0, flag = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major != 9 || minor != 0) return false;
  if (cudaMemcpyFromSymbol(&flag, g_probe_arch, sizeof(int)) != cudaSuccess) flag = 0;
  (void)cudaGetLastError();
  return flag == 1;
}

// The device's SM count (0 on an error).
int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// Times a probe kernel (iters, sink) on `ctas` CTAs of 256 threads with `smem` bytes of dynamic
// shared memory: the best of 5 launches after a warm-up, in ms; <= 0 on a CUDA error.
float time_probe(void (*kernel)(int, float*), int ctas, int smem, int iters) {
  float* sink = nullptr;
  if (cudaMalloc(&sink, sizeof(float)) != cudaSuccess) return -1.f;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  kernel<<<ctas, 256, smem>>>(64, sink);  // warm-up
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(e0);
    kernel<<<ctas, 256, smem>>>(iters, sink);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  const bool ok = cudaGetLastError() == cudaSuccess;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(sink);
  return ok ? best : -1.f;
}

}  // namespace

double measure_wgmma_mix_tflops(int mix) {
  if (mix < 1 || mix > 5 || !probe_code_loaded()) return 0.0;
  void (*kernel)(int, float*) = mix == 1   ? wgmma_mix_kernel<1>
                                : mix == 2 ? wgmma_mix_kernel<2>
                                : mix == 3 ? wgmma_mix_kernel<3>
                                : mix == 4 ? wgmma_mix_kernel<4>
                                           : wgmma_mix_kernel<5>;
  const int sms = sm_count(), iters = 2048;
  const float ms = time_probe(kernel, sms, 96 * 1024 + 1024, iters);
  if (ms <= 0.f) return 0.0;
  const double per_round = (mix >= 4 ? 2.0 : 1.0) * 2.0 * 64 * 128 * 128;  // one or both GEMMs of a 64-row tile
  return per_round * double(iters) * 2 /* warpgroups */ * sms / (double(ms) * 1e-3) / 1e12;
}

double measure_wgmma_tflops() {
  if (!probe_code_loaded()) return 0.0;
  const int sms = sm_count(), iters = 4096;
  const float ms = time_probe(wgmma_rate_kernel, sms * 2, 48 * 1024 + 1024, iters);
  if (ms <= 0.f) return 0.0;
  const double flops = 2.0 * 64 * 256 * 16 * 8 * double(iters) * 2 /* warpgroups */ * sms * 2;
  return flops / (double(ms) * 1e-3) / 1e12;
}

}  // namespace kvattn::tools::cuda_bench
