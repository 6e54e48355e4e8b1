// tools/cuda/bench_wgmma.cu — the wgmma bf16 rate ceiling of `kvattn bench-cuda`: a probe
// kernel that only issues m64n256k16 from shared memory (sm_90a; elsewhere the ceiling is 0).
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
// The wgmma bf16 rate probe: 2 warpgroups per CTA, each issuing m64n256k16 from a 48 KB shared
// tile (filled with small non-zero bf16 values) in groups of 8, 2 CTAs per SM; FLOPs counted
// 2 * 64 * 256 * 16 per instruction.
__global__ void __launch_bounds__(256, 1) wgmma_rate_kernel(int iters, float* sink) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* sb = smem_raw + (base - raw);
  for (int i = threadIdx.x; i < 48 * 1024 / 2; i += blockDim.x)
    reinterpret_cast<__nv_bfloat16*>(sb)[i] = __float2bfloat16(0.001f * float((i * 37) % 61 - 30));
  fence_proxy_async();
  __syncthreads();
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
#else
__device__ int g_probe_arch = 0;
__global__ void __launch_bounds__(256, 1) wgmma_rate_kernel(int, float*) {}
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

}  // namespace

double measure_wgmma_tflops() {
  if (!probe_code_loaded()) return 0.0;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  constexpr int kProbeSmem = 48 * 1024 + 1024;
  float* sink = nullptr;
  if (cudaMalloc(&sink, sizeof(float)) != cudaSuccess) return 0.0;
  cudaFuncSetAttribute(wgmma_rate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kProbeSmem);
  const int iters = 4096;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  wgmma_rate_kernel<<<sms * 2, 256, kProbeSmem>>>(64, sink);  // warm-up
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(e0);
    wgmma_rate_kernel<<<sms * 2, 256, kProbeSmem>>>(iters, sink);
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
  if (!ok) return 0.0;
  const double flops = 2.0 * 64 * 256 * 16 * 8 * double(iters) * 2 /* warpgroups */ * sms * 2;
  return flops / (double(best) * 1e-3) / 1e12;
}

}  // namespace kvattn::tools::cuda_bench
