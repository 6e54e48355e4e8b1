// src/ops/cuda/ptx.cuh — the inline-PTX wrappers the attention kernels share: cp.async (also with
// an L2 evict-first policy, and with an ignore-src zero fill), an acquire load, ldmatrix, mma.sync
// m16n8k16 and the 16-bit pack (paged_attention, prefill, small, page and Hopper kernels).
// Device code only; every function is force-inlined, so sharing them changes no kernel's code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kvattn::ops::cuda_impl::k {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes < 16 zero-fills the rest (0: all zeros, src unread).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 16-byte cp.async that writes zeros instead of reading when `ignore` != 0 (ignore-src operand:
// no src-size to compute per copy).
__device__ __forceinline__ void cpa16z(uint32_t dst, const void* src, uint32_t ignore) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(dst),
               "l"(src), "r"(ignore));
}
// An L2 cache policy marking the lines it is used on evict-first: for data each call reads once
// (the decode kernels' K/V), so that streaming it through L2 does not push other lines out first.
// Measured on an H200: on the K/V copies of the decode kernels,
// the whole-page decode 1.5-2.2 % faster at 64 / 128 x 4096, attn_kernel 4.7 % at 32 x 4096, the
// small path 1 x 1024 0.4 us faster; a 256-byte L2 prefetch hint made the whole-page decode 5-6 %
// slower.  Not volatile: a pure value, so the kernels hoist it out of their tile loops (measured
// with the small path's 1 x 1024: median 9.6 against 10.2 us).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// cp_async16 with an L2 cache policy (l2_evict_first_policy).
__device__ __forceinline__ void cp_async16_policy(uint32_t dst, const void* src, int src_bytes, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src), "r"(src_bytes),
               "l"(policy));
}
// cp_async16_policy when use_policy, else cp_async16 (a per-call choice, one predicated copy).
// (A policy made with L2::evict_normal instead ran into "illegal instruction" on an H200.)
__device__ __forceinline__ void cp_async16_policy_if(uint32_t dst, const void* src, int src_bytes, uint64_t policy,
                                                     bool use_policy) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %4, 0;\n"
      " @p cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n"
      " @!p cp.async.cg.shared.global [%0], [%1], 16, %2;\n}\n" ::"r"(dst),
      "l"(src), "r"(src_bytes), "l"(policy), "r"(static_cast<uint32_t>(use_policy)));
}
// 4- or 8-byte global -> shared copy of one index word (cp.async.ca: sizes below 16 go through
// L1); like every cp.async it is waited for by cp.async.wait_group, not by a block barrier, so
// an index loaded ahead stays in flight across __syncthreads() (a load into a register would be
// waited for at the barrier).
__device__ __forceinline__ void cp_async_idx(uint32_t dst, const void* src, bool is64) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %2, 0;\n @p cp.async.ca.shared.global [%0], [%1], 8;\n"
      " @!p cp.async.ca.shared.global [%0], [%1], 4;\n}\n" ::"r"(dst),
      "l"(src), "r"(static_cast<uint32_t>(is64)));
}
// A GPU-scope acquire load of a counter: this thread's later loads see every write that was
// made visible (fence, then count) before the count it reads.
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// A GPU-scope relaxed load of a counter, to read it early: a thread that acts on the value it
// saw follows it with __threadfence() (the fence makes it an acquire of the counts it observed).
__device__ __forceinline__ int ld_relaxed_gpu(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are pending.  The kernels that follow it with
// __syncthreads() use this form; cp_async_wait_mem also orders the compiler's shared-memory
// accesses around it (small_decode.cu, whose warps synchronise with __syncwarp only).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void cp_async_wait_mem() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) { ldsm_x4(addr, r[0], r[1], r[2], r[3]); }
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) { ldsm_x4_t(addr, r[0], r[1], r[2], r[3]); }

// c += a * b, m16n8k16, f32 accumulators, bf16 or f16 operands.  kOrdered = true keeps the asm
// volatile (issued in program order); the prefill kernel passes false so the compiler may
// schedule the MMAs between the fragment loads and softmax work (measured faster there).
#define KVATTN_MMA16816(T)                                                                              \
  "mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                        \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)
template <bool BF16, bool kOrdered = true>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kOrdered) {
    if constexpr (BF16) asm volatile(KVATTN_MMA16816("bf16"));
    else asm volatile(KVATTN_MMA16816("f16"));
  } else {
    if constexpr (BF16) asm(KVATTN_MMA16816("bf16"));
    else asm(KVATTN_MMA16816("f16"));
  }
}
#undef KVATTN_MMA16816

// Two floats -> one register of two bf16 / f16 values, round to nearest even (lo in bits 0-15).
template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (BF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

}  // namespace kvattn::ops::cuda_impl::k
