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

// out = a + b over 16-byte vectors (32-bit lane adds), one vector per thread, a full grid of
// 256-thread CTAs: the memory pattern of merge_attn_states' vector kernel (two streams read, one
// written, same addresses) without its arithmetic or LSE loads.
__global__ void stream3_kernel(const uint4* a, const uint4* b, uint4* out, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const uint4 x = __ldcs(a + i), y = __ldcs(b + i);
  __stcs(out + i, make_uint4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
}

// This thread's share of 64-key tile t of (request req, KV head hk): 16-byte chunk c of rows
// r0, r0 + 8, ..., r0 + 56 of K (d[0..7]) and of V (d[8..15]); 16-key pages, request-major ids.
__device__ __forceinline__ void load_tile_rows(const char* k, const char* v, int64_t page_b, int64_t slot_b,
                                               int64_t head_b, const int32_t* indices, int tiles, int req, int hk,
                                               int t, int r0, int c, uint4 (&d)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int key = t * 64 + r0 + 8 * i;
    const int64_t pg = indices[int64_t(req) * tiles * 4 + key / 16];
    const int64_t off = pg * page_b + int64_t(key % 16) * slot_b + int64_t(hk) * head_b + c * 16;
    d[i] = __ldcs(reinterpret_cast<const uint4*>(k + off));
    d[8 + i] = __ldcs(reinterpret_cast<const uint4*>(v + off));
  }
}

// Reads the K and V rows the decode kernel reads for uniform requests of `tiles` 64-key tiles
// (16-key pages, one KV head per unit, 256-byte rows), with nothing else: CTA = (request, chunk
// of 8 tiles, KV head) in the decode's unit order (the heads of a chunk adjacent); per tile each
// of the 128 threads loads 8 K and 8 V 16-byte chunks, two tiles unrolled (32 loads in flight).
// Small CTAs, so many are resident.  A simple kernel with a start and a tail of its own: a lower
// bound of the access pattern's read ceiling, not a proof of it.
__global__ void kv_gather_kernel(const char* k, const char* v, int64_t page_b, int64_t slot_b, int64_t head_b,
                                 const int32_t* indices, int tiles, int hkv, uint32_t* sink) {
  constexpr int kChunkTiles = 8;
  const int chunks = tiles / kChunkTiles;
  const int w = blockIdx.x;
  const int hk = w % hkv, item = w / hkv;
  const int req = item / chunks, chunk = item % chunks;
  const int tid = threadIdx.x, c = tid & 15, r0 = tid >> 4;  // chunk of a row, first of 8 rows
  uint32_t acc = 0;
  for (int t = chunk * kChunkTiles; t < (chunk + 1) * kChunkTiles; t += 2) {
    uint4 x[2][16];
#pragma unroll
    for (int u = 0; u < 2; ++u) load_tile_rows(k, v, page_b, slot_b, head_b, indices, tiles, req, hk, t + u, r0, c, x[u]);
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < 16; ++i) acc ^= x[u][i].x ^ x[u][i].y ^ x[u][i].z ^ x[u][i].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads
}

// The same loads, the grid resident and every CTA given one contiguous range of the call's
// tiles (units in the decode's order, tiles within a unit): equal bytes per CTA, no tail from
// unit sizes and no CTA starts after the first (what a stream-K schedule would read).
__global__ void kv_gather_ranges_kernel(const char* k, const char* v, int64_t page_b, int64_t slot_b, int64_t head_b,
                                        const int32_t* indices, int tiles, int hkv, int64_t total, uint32_t* sink) {
  const int64_t G = gridDim.x, c = blockIdx.x;
  const int64_t x0 = c * total / G, x1 = (c + 1) * total / G;
  const int tid = threadIdx.x, ch = tid & 15, r0 = tid >> 4;
  uint32_t acc = 0;
  for (int64_t x = x0; x < x1; x += 2) {
    uint4 d[2][16];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int64_t xx = min(x + u, x1 - 1);  // an odd range re-reads its last tile (cached)
      const int64_t unit = xx / tiles;
      const int t = static_cast<int>(xx - unit * tiles);
      const int req = static_cast<int>(unit / hkv), hk = static_cast<int>(unit % hkv);
      load_tile_rows(k, v, page_b, slot_b, head_b, indices, tiles, req, hk, t, r0, ch, d[u]);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < 16; ++i) acc ^= d[u][i].x ^ d[u][i].y ^ d[u][i].z ^ d[u][i].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// The same bytes read as whole pages: the grid resident, every CTA one contiguous range of the
// call's (request, page) pairs, each page's K rows of every KV head (16 slots x hkv x 256 bytes,
// contiguous in the NHD pool) and its V rows, 16 chunks of each per thread in flight.  What a
// decode that read each page once for all its KV heads would read, balanced as the ranges above.
__global__ void kv_gather_pages_kernel(const char* k, const char* v, int64_t page_b, const int32_t* indices,
                                       int64_t total, int page_chunks, uint32_t* sink) {
  const int64_t G = gridDim.x, c = blockIdx.x;
  const int64_t x0 = c * total / G, x1 = (c + 1) * total / G;
  uint32_t acc = 0;
  for (int64_t x = x0; x < x1; ++x) {
    const int64_t pg = indices[x];
    const uint4* kp = reinterpret_cast<const uint4*>(k + pg * page_b);
    const uint4* vp = reinterpret_cast<const uint4*>(v + pg * page_b);
    for (int i0 = threadIdx.x; i0 < page_chunks; i0 += 16 * blockDim.x) {
      uint4 d[32];
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        const int i = min(i0 + u * static_cast<int>(blockDim.x), page_chunks - 1);
        d[u] = __ldcs(kp + i);
        d[16 + u] = __ldcs(vp + i);
      }
#pragma unroll
      for (int u = 0; u < 32; ++u) acc ^= d[u].x ^ d[u].y ^ d[u].z ^ d[u].w;
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

}  // namespace

double measure_stream3_tbps(int64_t bytes) {
  const int sets = 4;
  std::vector<void*> buf(3 * sets, nullptr);
  for (auto& b : buf) {
    if (cudaMalloc(&b, bytes) != cudaSuccess) {
      for (auto& f : buf) cudaFree(f);
      (void)cudaGetLastError();
      return 0;
    }
    cudaMemset(b, 1, bytes);
  }
  struct Ctx { std::vector<void*>* buf; int64_t n; int sets; } ctx{&buf, bytes / 16, sets};
  const double us = time_median_us(
      [](void* c, int i) {
        auto* x = static_cast<Ctx*>(c);
        const int s = i % x->sets;
        void** b = x->buf->data() + 3 * s;
        const int64_t blocks = (x->n + 255) / 256;
        stream3_kernel<<<static_cast<unsigned>(blocks), 256>>>(static_cast<const uint4*>(b[0]),
                                                               static_cast<const uint4*>(b[1]), static_cast<uint4*>(b[2]),
                                                               x->n);
      },
      &ctx, 4, 20);
  for (auto& b : buf) cudaFree(b);
  return 3.0 * bytes / (us * 1e-6) / 1e12;
}

double measure_kv_gather_tbps(const void* k, const void* v, int64_t page_b, int64_t slot_b, int64_t head_b,
                              const int32_t* indices, int batch, int tiles, int hkv, int mode) {
  if (tiles % 8 != 0 || batch <= 0) return 0;
  const bool ranges = mode != 0;
  uint32_t* sink = nullptr;
  cudaMalloc(&sink, 16);
  int grid = 0;  // ranges: every CTA resident at once
  if (ranges) {
    int sms = 0, per = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    if (mode == 2)
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kv_gather_pages_kernel, 128, 0);
    else
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kv_gather_ranges_kernel, 128, 0);
    grid = std::max(sms * per, 1);
  }
  struct Ctx {
    const char *k, *v;
    int64_t page_b, slot_b, head_b;
    const int32_t* indices;
    int batch, tiles, hkv, grid, mode;
    uint32_t* sink;
  } ctx{static_cast<const char*>(k), static_cast<const char*>(v), page_b, slot_b, head_b, indices, batch, tiles, hkv,
        grid, mode, sink};
  const double us = time_median_us(
      [](void* c, int) {
        auto* x = static_cast<Ctx*>(c);
        if (x->mode == 2) {
          const int page_chunks = static_cast<int>(16 * x->slot_b / 16);  // 16 slots of every head
          kv_gather_pages_kernel<<<x->grid, 128>>>(x->k, x->v, x->page_b, x->indices, int64_t(x->batch) * x->tiles * 4,
                                                   page_chunks, x->sink);
          return;
        }
        if (x->grid > 0) {
          const int64_t total = int64_t(x->batch) * x->hkv * x->tiles;
          kv_gather_ranges_kernel<<<x->grid, 128>>>(x->k, x->v, x->page_b, x->slot_b, x->head_b, x->indices, x->tiles,
                                                    x->hkv, total, x->sink);
          return;
        }
        const unsigned blocks = static_cast<unsigned>(x->batch * (x->tiles / 8) * x->hkv);
        kv_gather_kernel<<<blocks, 128>>>(x->k, x->v, x->page_b, x->slot_b, x->head_b, x->indices, x->tiles, x->hkv,
                                          x->sink);
      },
      &ctx, 4, 20);
  cudaFree(sink);
  return double(batch) * tiles * 64 * hkv * 256 * 2 / (us * 1e-6) / 1e12;
}

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
