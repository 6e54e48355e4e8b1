// src/ops/cuda/cache_ops.cu — KV-cache write (reshape_and_cache_flash), fp8 page dequant,
// block zeroing and the page-table helpers.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/routing.h"

#include <atomic>
#include <cstdlib>

namespace kvattn::ops::cuda_impl::k {
namespace {

// ---- reshape_and_cache_flash -------------------------------------------------------------------
template <typename S>
struct SrcVec;  // 16-byte source vectors
template <> struct SrcVec<uint16_t> { static constexpr int N = 8; };
template <> struct SrcVec<float> { static constexpr int N = 4; };

template <typename S>
__device__ __forceinline__ float src_to_f32(S x, Elt t) {
  if constexpr (sizeof(S) == 4) return x;
  else return t == Elt::bf16 ? bf16_bits_to_f32(x) : f16_bits_to_f32(x);
}

__device__ __forceinline__ uint8_t to_fp8(float x, Elt t) {
  return t == Elt::e4m3 ? f32_to_fp8_e4m3_bits(x) : f32_to_fp8_e5m2_bits(x);
}

// Fast path: head dims contiguous on both sides, 16-byte aligned.  One thread moves one
// 16-byte source vector of K and the matching one of V.
template <typename S, bool FP8>
__global__ void cache_write_vec(CacheWriteParams p) {
  constexpr int N = SrcVec<S>::N;
  const int64_t vecs_per_head = p.head_size / N;
  const int64_t per_token = p.num_heads * vecs_per_head;
  const int64_t total = p.num_tokens * per_token;
  const bool small = total < (int64_t(1) << 31);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t t, h, d;
    if (small) {  // 32-bit index math
      const uint32_t i32 = static_cast<uint32_t>(i), pt = static_cast<uint32_t>(per_token);
      const uint32_t vph = static_cast<uint32_t>(vecs_per_head);
      const uint32_t t32 = i32 / pt, rem = i32 - t32 * pt, h32 = rem / vph;
      t = t32; h = h32; d = int64_t(rem - h32 * vph) * N;
    } else {
      t = i / per_token;
      const int64_t rem = i - t * per_token;
      h = rem / vecs_per_head;
      d = (rem - h * vecs_per_head) * N;
    }
    const int64_t slot = load_idx(p.slots, t);
    if (slot < 0 || slot >= p.num_blocks * p.block_size) continue;
    const int64_t blk = slot / p.block_size, off = slot - blk * p.block_size;
    const uint4 kv = *reinterpret_cast<const uint4*>(static_cast<const S*>(p.key) + t * p.k_st + h * p.k_sh + d);
    const uint4 vv = *reinterpret_cast<const uint4*>(static_cast<const S*>(p.value) + t * p.v_st + h * p.v_sh + d);
    const int64_t kdst = blk * p.kc_sb + off * p.kc_so + h * p.kc_sh + d;
    const int64_t vdst = blk * p.vc_sb + off * p.vc_so + h * p.vc_sh + d;
    if constexpr (!FP8) {
      // same dtype: a plain 16-byte copy
      *reinterpret_cast<uint4*>(static_cast<S*>(p.key_cache) + kdst) = kv;
      *reinterpret_cast<uint4*>(static_cast<S*>(p.value_cache) + vdst) = vv;
    } else {
      const float ks = p.k_scale[p.per_head_scale ? h : 0];
      const float vs = p.v_scale[p.per_head_scale ? h : 0];
      const S* ke = reinterpret_cast<const S*>(&kv);
      const S* ve = reinterpret_cast<const S*>(&vv);
      uint8_t ko[N], vo[N];
#pragma unroll
      for (int e = 0; e < N; ++e) {
        ko[e] = to_fp8(src_to_f32<S>(ke[e], p.src) / ks, p.dst);
        vo[e] = to_fp8(src_to_f32<S>(ve[e], p.src) / vs, p.dst);
      }
      uint8_t* kd = static_cast<uint8_t*>(p.key_cache) + kdst;
      uint8_t* vd = static_cast<uint8_t*>(p.value_cache) + vdst;
      if constexpr (N == 8) {
        *reinterpret_cast<uint2*>(kd) = *reinterpret_cast<const uint2*>(ko);
        *reinterpret_cast<uint2*>(vd) = *reinterpret_cast<const uint2*>(vo);
      } else {
        *reinterpret_cast<uint32_t*>(kd) = *reinterpret_cast<const uint32_t*>(ko);
        *reinterpret_cast<uint32_t*>(vd) = *reinterpret_cast<const uint32_t*>(vo);
      }
    }
  }
}

// Same-dtype fast path (the default): each thread moves VPT vectors of K and the matching ones
// of V (i, i + stride, ...) and issues all their loads (K, V, slot) before its first store, so
// it waits for one memory round trip instead of two per vector.  16384 tokens (bf16, 8 x 128):
// 39.3 vs 39.8-39.9 us with one vector per thread and the slot loaded first, 2 alternations in
// one process on an H200; 4 vectors: 39.8 us).
template <typename S, int VPT>
__global__ void cache_write_vec_multi(CacheWriteParams p) {
  constexpr int N = SrcVec<S>::N;
  const uint32_t vph = static_cast<uint32_t>(p.head_size / N);
  const uint32_t per_token = static_cast<uint32_t>(p.num_heads) * vph;
  const int64_t total = p.num_tokens * int64_t(per_token);  // < 2^31 (the launcher checks)
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t slots = p.num_blocks * p.block_size;
  for (int64_t i0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i0 < total; i0 += stride * VPT) {
    uint4 kv[VPT], vv[VPT];
    int64_t slot[VPT], h[VPT], d[VPT];
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int64_t i = i0 + j * stride;
      slot[j] = -1;
      h[j] = d[j] = 0;
      if (i >= total) continue;
      const uint32_t i32 = static_cast<uint32_t>(i);
      const uint32_t t = i32 / per_token, rem = i32 - t * per_token, hh = rem / vph;
      h[j] = hh;
      d[j] = int64_t(rem - hh * vph) * N;
      kv[j] = *reinterpret_cast<const uint4*>(static_cast<const S*>(p.key) + t * p.k_st + h[j] * p.k_sh + d[j]);
      vv[j] = *reinterpret_cast<const uint4*>(static_cast<const S*>(p.value) + t * p.v_st + h[j] * p.v_sh + d[j]);
      slot[j] = load_idx(p.slots, t);
    }
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (slot[j] < 0 || slot[j] >= slots) continue;  // padding tokens (negative), out of range
      const int64_t blk = slot[j] / p.block_size, off = slot[j] - blk * p.block_size;
      *reinterpret_cast<uint4*>(static_cast<S*>(p.key_cache) + blk * p.kc_sb + off * p.kc_so + h[j] * p.kc_sh + d[j]) = kv[j];
      *reinterpret_cast<uint4*>(static_cast<S*>(p.value_cache) + blk * p.vc_sb + off * p.vc_so + h[j] * p.vc_sh + d[j]) =
          vv[j];
    }
  }
}

// Any strides / dtypes: one thread per element of K and V.
__global__ void cache_write_generic(CacheWriteParams p) {
  const int64_t per_token = p.num_heads * p.head_size;
  const int64_t total = p.num_tokens * per_token;
  const bool fp8 = p.dst == Elt::e4m3 || p.dst == Elt::e5m2;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int64_t rem = i - t * per_token;
    const int64_t h = rem / p.head_size, d = rem - h * p.head_size;
    const int64_t slot = load_idx(p.slots, t);
    if (slot < 0 || slot >= p.num_blocks * p.block_size) continue;
    const int64_t blk = slot / p.block_size, off = slot - blk * p.block_size;
    float kx = load_elt(p.key, t * p.k_st + h * p.k_sh + d * p.k_sd, p.src);
    float vx = load_elt(p.value, t * p.v_st + h * p.v_sh + d * p.v_sd, p.src);
    if (fp8) {
      kx = kx / p.k_scale[p.per_head_scale ? h : 0];
      vx = vx / p.v_scale[p.per_head_scale ? h : 0];
    }
    store_elt(p.key_cache, blk * p.kc_sb + off * p.kc_so + h * p.kc_sh + d * p.kc_sd, p.dst, kx);
    store_elt(p.value_cache, blk * p.vc_sb + off * p.vc_so + h * p.vc_sh + d * p.vc_sd, p.dst, vx);
  }
}

int grid_for(int64_t total, int threads) {
  int64_t b = (total + threads - 1) / threads;
  if (b > 65535LL * 16) b = 65535LL * 16;
  return static_cast<int>(b < 1 ? 1 : b);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- zero_kv_blocks ---------------------------------------------------------------------------------
// grid (blocks, segments, chunks of 4096 words); 16-byte stores where the run is aligned.
__global__ void zero_blocks_kernel(const int64_t* addrs, const int64_t* strides, const int64_t* pages,
                                   Idx ids, int64_t num_ids) {
  const int64_t b = blockIdx.x;
  const int s = blockIdx.y;
  const int64_t page = pages[s];
  const int64_t c0 = int64_t(blockIdx.z) * 4096;
  if (c0 >= page) return;
  const int64_t id = load_idx(ids, b);
  if (id < 0) return;
  uint32_t* base = reinterpret_cast<uint32_t*>(static_cast<uintptr_t>(addrs[s])) + id * strides[s];
  const int64_t n = min(page - c0, int64_t(4096));
  uint32_t* p = base + c0;
  // head words until 16-byte alignment, then uint4 stores, then the tail
  int64_t head = ((16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15) / 4;
  if (head > n) head = n;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) p[i] = 0u;
  const int64_t nv = (n - head) / 4;
  uint4* pv = reinterpret_cast<uint4*>(p + head);
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) pv[i] = make_uint4(0u, 0u, 0u, 0u);
  for (int64_t i = head + nv * 4 + threadIdx.x; i < n; i += blockDim.x) p[i] = 0u;
}

// ---- copy_page_indices / mamba_align --------------------------------------------------------------
__global__ void copy_page_indices_kernel(Idx out, Idx bt, Idx indptr) {
  const int64_t r = blockIdx.x;
  const int64_t b = load_idx(indptr, r), e = load_idx(indptr, r + 1);
  for (int64_t i = threadIdx.x; i < e - b; i += blockDim.x) store_idx(out, b + i, load_idx2(bt, r, i));
}

__global__ void mamba_align_kernel(Idx out, Idx bt, Idx sl, int64_t R, int64_t n_out, int64_t width,
                                   int64_t bs) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= R * n_out) return;
  const int64_t r = i / n_out, j = i - r * n_out;
  int64_t start = (load_idx(sl, r) - 1) / bs;
  if (start < 0) start = 0;
  const int64_t c = start + j;
  store_idx2(out, r, j, c < width ? load_idx2(bt, r, c) : 0);
}

// ---- kvfp8_dequant --------------------------------------------------------------------------------
__global__ void kvfp8_dequant_kernel(Fp8DequantParams p) {
  const int64_t r = blockIdx.x / p.pages_per_req, c = blockIdx.x % p.pages_per_req;
  const int64_t page = load_idx2(p.block_tables, r, c);
  if (page <= 0 || page >= p.num_pages) return;
  const int64_t mock = r * p.pages_per_req + 1 + c;
  const float ks = *p.k_scale, vs = *p.v_scale;
  const int64_t per_page = p.page_size * p.num_heads * p.head_dim;
  for (int64_t i = threadIdx.x; i < per_page; i += blockDim.x) {
    const int64_t s = i / (p.num_heads * p.head_dim);
    const int64_t rem = i - s * p.num_heads * p.head_dim;
    const int64_t h = rem / p.head_dim, d = rem - h * p.head_dim;
    const float kx = load_elt(p.k, page * p.k_sb + s * p.k_so + h * p.k_sh + d * p.k_sd, p.src) * ks;
    const float vx = load_elt(p.v, page * p.v_sb + s * p.v_so + h * p.v_sh + d * p.v_sd, p.src) * vs;
    store_elt(p.ok, mock * p.ok_sb + s * p.ok_so + h * p.ok_sh + d * p.ok_sd, p.dst, kx);
    store_elt(p.ov, mock * p.ov_sb + s * p.ov_so + h * p.ov_sh + d * p.ov_sd, p.dst, vx);
  }
}

}  // namespace

int launch_reshape_and_cache(const CacheWriteParams& p) {
  if (p.num_tokens == 0 || p.num_heads == 0 || p.head_size == 0) return 0;
  const bool fp8 = p.dst == Elt::e4m3 || p.dst == Elt::e5m2;
  const int ssz = elt_size(p.src), dsz = elt_size(p.dst);
  const int N = ssz == 4 ? 4 : 8;
  bool vec = p.k_sd == 1 && p.v_sd == 1 && p.kc_sd == 1 && p.vc_sd == 1 && p.head_size % N == 0 &&
             (fp8 || p.src == p.dst) && p.src != Elt::e4m3 && p.src != Elt::e5m2;
  if (vec) {
    vec = aligned16(p.key) && aligned16(p.value) && (p.k_st * ssz) % 16 == 0 && (p.k_sh * ssz) % 16 == 0 &&
          (p.v_st * ssz) % 16 == 0 && (p.v_sh * ssz) % 16 == 0;
    const int64_t dv = int64_t(N) * dsz;  // destination bytes per vector
    auto ok = [&](const void* b, int64_t sb, int64_t so, int64_t sh) {
      return (reinterpret_cast<uintptr_t>(b) % dv) == 0 && (sb * dsz) % dv == 0 && (so * dsz) % dv == 0 &&
             (sh * dsz) % dv == 0;
    };
    vec = vec && ok(p.key_cache, p.kc_sb, p.kc_so, p.kc_sh) && ok(p.value_cache, p.vc_sb, p.vc_so, p.vc_sh);
  }
  const int threads = 256;
  if (vec) {
    const int64_t total = p.num_tokens * p.num_heads * (p.head_size / N);
    const int grid = grid_for(total, threads);
    if (!fp8 && kernel_routing().cache_write_pairs && total < (int64_t(1) << 31)) {
      const int g = (grid + 1) / 2;
      if (ssz == 4) cache_write_vec_multi<float, 2><<<g, threads>>>(p);
      else cache_write_vec_multi<uint16_t, 2><<<g, threads>>>(p);
      return static_cast<int>(cudaGetLastError());
    }
    if (ssz == 4) {
      if (fp8) cache_write_vec<float, true><<<grid, threads>>>(p);
      else cache_write_vec<float, false><<<grid, threads>>>(p);
    } else {
      if (fp8) cache_write_vec<uint16_t, true><<<grid, threads>>>(p);
      else cache_write_vec<uint16_t, false><<<grid, threads>>>(p);
    }
  } else {
    const int64_t total = p.num_tokens * p.num_heads * p.head_size;
    cache_write_generic<<<grid_for(total, threads), threads>>>(p);
  }
  return static_cast<int>(cudaGetLastError());
}

int launch_zero_kv_blocks(const int64_t* addrs, const int64_t* strides, const int64_t* pages, int64_t num_segs,
                          Idx block_ids, int64_t num_ids, int64_t max_page_words) {
  if (num_segs == 0 || num_ids == 0 || max_page_words <= 0) return 0;
  const int64_t chunks = (max_page_words + 4095) / 4096;
  if (num_segs > 65535 || chunks > 65535 || num_ids > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  dim3 grid(static_cast<unsigned>(num_ids), static_cast<unsigned>(num_segs), static_cast<unsigned>(chunks));
  zero_blocks_kernel<<<grid, 256>>>(addrs, strides, pages, block_ids, num_ids);
  return static_cast<int>(cudaGetLastError());
}

int launch_copy_page_indices(Idx out, Idx block_table, Idx indptr, int64_t num_reqs) {
  if (num_reqs == 0) return 0;
  copy_page_indices_kernel<<<static_cast<unsigned>(num_reqs), 256>>>(out, block_table, indptr);
  return static_cast<int>(cudaGetLastError());
}

int launch_mamba_align(Idx out, Idx block_table, Idx seq_lens, int64_t num_reqs, int64_t n_out, int64_t width,
                       int64_t block_size) {
  const int64_t total = num_reqs * n_out;
  if (total == 0) return 0;
  mamba_align_kernel<<<static_cast<unsigned>((total + 255) / 256), 256>>>(out, block_table, seq_lens, num_reqs, n_out,
                                                                          width, block_size);
  return static_cast<int>(cudaGetLastError());
}

int launch_kvfp8_dequant(const Fp8DequantParams& p) {
  const int64_t n = p.num_reqs * p.pages_per_req;
  if (n == 0) return 0;
  kvfp8_dequant_kernel<<<static_cast<unsigned>(n), 256>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvattn::ops::cuda_impl::k
