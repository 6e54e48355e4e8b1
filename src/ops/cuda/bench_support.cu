// src/ops/cuda/bench_support.cu — the ceilings `kvattn bench-cuda` reports next to the ops:
// device copy bandwidth and the mma.sync bf16 rate, plus event timing.
#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_common.cuh"

namespace kvattn::ops::cuda_impl::k {
namespace {

__global__ void mma_peak_kernel(float* out, int iters) {
  uint32_t a[4], b[2];
  const uint32_t seed = threadIdx.x * 2654435761u + blockIdx.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = (seed ^ (i * 0x9e3779b9u)) & 0x3f803f80u;
  b[0] = (seed * 7u) & 0x3f803f80u;
  b[1] = (seed * 13u) & 0x3f803f80u;
  float c[8][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 12345.f) out[0] = s;
}

}  // namespace

double time_median_us(void (*fn)(void*, int), void* ctx, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn(ctx, i);
  cudaDeviceSynchronize();
  std::vector<cudaEvent_t> ev(static_cast<size_t>(iters) + 1);
  for (auto& e : ev) cudaEventCreate(&e);
  cudaEventRecord(ev[0]);
  for (int i = 0; i < iters; ++i) {
    fn(ctx, warmup + i);
    cudaEventRecord(ev[static_cast<size_t>(i) + 1]);
  }
  cudaEventSynchronize(ev.back());
  std::vector<float> t(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]);
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] * 1000.0;
}

double measure_copy_tbps(int64_t bytes) {
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    (void)cudaGetLastError();
    return 0;
  }
  cudaMemset(a, 1, bytes);
  struct Ctx { void *a, *b; int64_t n; } ctx{a, b, bytes};
  const double us = time_median_us(
      [](void* c, int) {
        auto* x = static_cast<Ctx*>(c);
        cudaMemcpyAsync(x->b, x->a, x->n, cudaMemcpyDeviceToDevice);
      },
      &ctx, 2, 10);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (us * 1e-6) / 1e12;
}

double measure_mma_tflops() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out = nullptr;
  cudaMalloc(&out, 16);
  const int iters = 4096, blocks = sms * 4, threads = 256;
  struct Ctx { float* out; int blocks, threads, iters; } ctx{out, blocks, threads, iters};
  const double us = time_median_us(
      [](void* c, int) {
        auto* x = static_cast<Ctx*>(c);
        mma_peak_kernel<<<x->blocks, x->threads>>>(x->out, x->iters);
      },
      &ctx, 2, 5);
  cudaFree(out);
  const double flops = double(blocks) * (threads / 32) * iters * 8 * (2.0 * 16 * 8 * 16);
  return flops / (us * 1e-6) / 1e12;
}

}  // namespace kvattn::ops::cuda_impl::k
