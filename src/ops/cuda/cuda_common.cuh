// src/ops/cuda/cuda_common.cuh — device helpers shared by the ops kernels (CUDA sources only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kvattn/core/dtype.h"
#include "ops/cuda/kernels.h"

namespace kvattn::ops::cuda_impl::k {

// Whether the call reads each K/V byte once: every request has one query token, so its rows
// are one unit's (attn_kernel, the small path).  Their K/V copies are then evict-first in L2
// (ptx.cuh l2_evict_first_policy; other calls copy without a policy).
__device__ __forceinline__ bool kv_read_once(const AttnParams& p) { return p.num_tokens == p.batch; }

__device__ __forceinline__ int64_t load_idx(const Idx& x, int64_t i) {
  if (x.is64) return static_cast<const int64_t*>(x.ptr)[i * x.s0];
  return static_cast<const int32_t*>(x.ptr)[i * x.s0];
}
__device__ __forceinline__ int64_t load_idx2(const Idx& x, int64_t r, int64_t c) {
  if (x.is64) return static_cast<const int64_t*>(x.ptr)[r * x.s0 + c * x.s1];
  return static_cast<const int32_t*>(x.ptr)[r * x.s0 + c * x.s1];
}
// An index word loaded ahead of its use (the prefill loader's page ids, one tile ahead; the decode
// loader's first tiles): the load is only issued here, and idx_word_value() converts it where it
// is used.  load_idx() converts the word to int64 at once, so the warp waits for the load right
// there: in the decode kernel
// that wait drew 14 % of all stall samples (ncu, H200).  Both widths
// load into the same registers (no move after the load that would wait for it).  elem: element
// offset (index times strides); valid = false: no load, the value reads -1.
struct IdxWord {
  uint32_t lo, hi;  // hi: 64-bit indices only
};
__device__ __forceinline__ IdxWord load_idx_word(const Idx& x, int64_t elem, bool valid) {
  IdxWord w{0xffffffffu, 0xffffffffu};
  if (valid) {
    const char* a = static_cast<const char*>(x.ptr) + elem * (x.is64 ? 8 : 4);
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.u32 p, %3, 0;\n @p ld.global.v2.u32 {%0, %1}, [%2];\n"
        " @!p ld.global.u32 %0, [%2];\n}\n"
        : "+r"(w.lo), "+r"(w.hi)
        : "l"(a), "r"(static_cast<uint32_t>(x.is64)));
  }
  return w;
}
__device__ __forceinline__ int64_t idx_word_value(const Idx& x, IdxWord w) {
  return x.is64 ? static_cast<int64_t>((uint64_t(w.hi) << 32) | w.lo) : int64_t(static_cast<int32_t>(w.lo));
}
// The index tensor holding the attention call's page ids (FlashInfer's kv_indices or vLLM's block
// table) and the element offset of page `blk` of request `req` in it (pbase: the request's first
// entry in kv_indices, from the plan).
__device__ __forceinline__ const Idx& page_index(const AttnParams& p) {
  return p.paged_form ? p.kv_indices : p.block_table;
}
__device__ __forceinline__ int64_t page_elem(const AttnParams& p, int64_t pbase, int req, int blk) {
  return p.paged_form ? (pbase + blk) * p.kv_indices.s0 : int64_t(req) * p.block_table.s0 + int64_t(blk) * p.block_table.s1;
}
__device__ __forceinline__ void store_idx(const Idx& x, int64_t i, int64_t v) {
  if (x.is64) const_cast<int64_t*>(static_cast<const int64_t*>(x.ptr))[i * x.s0] = v;
  else const_cast<int32_t*>(static_cast<const int32_t*>(x.ptr))[i * x.s0] = static_cast<int32_t>(v);
}
__device__ __forceinline__ void store_idx2(const Idx& x, int64_t r, int64_t c, int64_t v) {
  if (x.is64) const_cast<int64_t*>(static_cast<const int64_t*>(x.ptr))[r * x.s0 + c * x.s1] = v;
  else const_cast<int32_t*>(static_cast<const int32_t*>(x.ptr))[r * x.s0 + c * x.s1] = static_cast<int32_t>(v);
}

// Scalar element load/store of a runtime float type (exact, via kvattn's conversions).
__device__ __forceinline__ float load_elt(const void* p, int64_t i, Elt t) {
  switch (t) {
    case Elt::f32: return static_cast<const float*>(p)[i];
    case Elt::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case Elt::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Elt::e4m3: return fp8_e4m3_bits_to_f32(static_cast<const uint8_t*>(p)[i]);
    case Elt::e5m2: return fp8_e5m2_bits_to_f32(static_cast<const uint8_t*>(p)[i]);
  }
  return 0.f;
}
__device__ __forceinline__ void store_elt(void* p, int64_t i, Elt t, float v) {
  switch (t) {
    case Elt::f32: static_cast<float*>(p)[i] = v; break;
    case Elt::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v); break;
    case Elt::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v); break;
    case Elt::e4m3: static_cast<uint8_t*>(p)[i] = f32_to_fp8_e4m3_bits(v); break;
    case Elt::e5m2: static_cast<uint8_t*>(p)[i] = f32_to_fp8_e5m2_bits(v); break;
  }
}

// Request r's query range [q_begin, q_end) (clamped to the call's tokens), KV length and first
// page-list entry (paged form; 0 with a block table), from the index tensors in one round trip
// (last_page_len is loaded unconditionally so nothing waits on kv_indptr first).
struct RequestBounds {
  int64_t q_begin, q_end, kv_len, page_base;
};
__device__ __forceinline__ RequestBounds load_request_bounds(const AttnParams& p, int r) {
  RequestBounds b;
  int64_t qs = load_idx(p.qo_indptr, r), qe = load_idx(p.qo_indptr, r + 1);
  b.page_base = 0;
  if (p.paged_form) {
    const int64_t pb = load_idx(p.kv_indptr, r), pe = load_idx(p.kv_indptr, r + 1);
    const int64_t last = load_idx(p.last_page_len, r);
    const int64_t np = max(pe - pb, int64_t(0));
    b.kv_len = np > 0 ? (np - 1) * p.page_size + min(max(last, int64_t(0)), int64_t(p.page_size)) : 0;
    b.page_base = pb;
  } else {
    b.kv_len = min(max(load_idx(p.seq_lens, r), int64_t(0)), p.max_blocks * p.page_size);
  }
  qs = min(max(qs, int64_t(0)), p.num_tokens);
  b.q_begin = qs;
  b.q_end = min(max(qe, qs), p.num_tokens);
  return b;
}

// Four consecutive head dims d..d+3 of output row (tok, head): one 8-byte store when the output
// is 16-bit with contiguous dims (p.o_vec), else four element stores (any dtype and stride).
__device__ __forceinline__ void store_out4(const AttnParams& p, int64_t tok, int head, int d, float a0, float a1,
                                           float a2, float a3) {
  if (p.o_vec) {
    uint2 o2;
    if (p.out_t == Elt::bf16) {
      __nv_bfloat162 h0 = __floats2bfloat162_rn(a0, a1), h1 = __floats2bfloat162_rn(a2, a3);
      o2.x = *reinterpret_cast<uint32_t*>(&h0);
      o2.y = *reinterpret_cast<uint32_t*>(&h1);
    } else {
      __half2 h0 = __floats2half2_rn(a0, a1), h1 = __floats2half2_rn(a2, a3);
      o2.x = *reinterpret_cast<uint32_t*>(&h0);
      o2.y = *reinterpret_cast<uint32_t*>(&h1);
    }
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + tok * p.o_st + int64_t(head) * p.o_sh + d) = o2;
  } else {
    const int64_t o = tok * p.o_st + int64_t(head) * p.o_sh;
    store_elt(p.out, o + int64_t(d) * p.o_sd, p.out_t, a0);
    store_elt(p.out, o + int64_t(d + 1) * p.o_sd, p.out_t, a1);
    store_elt(p.out, o + int64_t(d + 2) * p.o_sd, p.out_t, a2);
    store_elt(p.out, o + int64_t(d + 3) * p.o_sd, p.out_t, a3);
  }
}

inline int elt_size(Elt t) { return (t == Elt::f32) ? 4 : (t == Elt::f16 || t == Elt::bf16) ? 2 : 1; }

inline int64_t cdiv64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Attribute A of the calling thread's current device, cached per device (0 when it cannot be
// read: not cached, asked again next time).  Host code; the paths' routing checks use it.
template <cudaDeviceAttr A>
int device_attribute() {
  static std::atomic<int> cache[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  std::atomic<int>& c = cache[dev & 63];
  int v = c.load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaDeviceGetAttribute(&v, A, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    c.store(v, std::memory_order_relaxed);
  }
  return v;
}

// Opts kernel `Kern` into `smem` bytes of dynamic shared memory on the calling thread's current
// device, once per kernel and device (the attribute is per device).  Returns 0 or the CUDA error.
template <auto Kern>
int opt_in_dynamic_smem(int smem) {
  static bool done[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (done[dev & 63]) return 0;
  const cudaError_t e = cudaFuncSetAttribute(Kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return static_cast<int>(e);
  done[dev & 63] = true;
  return 0;
}

// Launch configuration (legacy stream) of `grid` in clusters of P CTAs along x, `threads` per
// CTA; `at` holds the cluster attribute the configuration points to, so it must outlive the
// launch or occupancy query.
inline cudaLaunchConfig_t cluster_config(dim3 grid, int P, size_t smem, int threads, cudaLaunchAttribute& at) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = nullptr;
  at = {};
  at.id = cudaLaunchAttributeClusterDimension;
  at.val.clusterDim.x = static_cast<unsigned>(P);
  at.val.clusterDim.y = 1;
  at.val.clusterDim.z = 1;
  cfg.attrs = &at;
  cfg.numAttrs = 1;
  return cfg;
}

}  // namespace kvattn::ops::cuda_impl::k
