// src/model/cuda/device_ops.cu — kvattn's kernels for the small ops of a decoder block and their
// launchers (device_kernels.h; the validated API of device_ops.h is in device_ops.cpp).  Each op
// is one kernel templated over the storage type (float, bf16, half): elements are loaded to
// f32, the arithmetic is f32 in the operation order of cpu_math.cpp (products are not
// contracted into FMAs where the CPU rounds them separately), and each result is rounded once
// (round-to-nearest-even) to the storage type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "model/cuda/device_kernels.h"

namespace kvattn::model::gpu {

namespace {

// ---- element access ------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ float ld(const T* p, int64_t i);
template <>
__device__ __forceinline__ float ld<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <>
__device__ __forceinline__ float ld<__half>(const __half* p, int64_t i) {
  return __half2float(p[i]);
}

template <class T>
__device__ __forceinline__ void st(T* p, int64_t i, float v);
template <>
__device__ __forceinline__ void st<float>(float* p, int64_t i, float v) {
  p[i] = v;
}
template <>
__device__ __forceinline__ void st<__nv_bfloat16>(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ void st<__half>(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}

// Rounds an f32 value to T and back (the value a store of v would hold).
template <class T>
__device__ __forceinline__ float round_to(float v) {
  T tmp;
  st<T>(&tmp, 0, v);
  return ld<T>(&tmp, 0);
}

// V consecutive elements moved as one 16-byte (or narrower) access.  The launchers pick
// V = 16 / sizeof(T) when every row start is 16-byte aligned and the row length a multiple of
// V, else V = 1 (plain element loads); the arithmetic is the same either way.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <class T, int V>
__device__ __forceinline__ void load_pack(const T* p, int64_t pack, float (&f)[V]) {
  const Pack<T, V> pk = reinterpret_cast<const Pack<T, V>*>(p)[pack];
#pragma unroll
  for (int k = 0; k < V; ++k) f[k] = ld<T>(pk.v, k);
}
template <class T, int V>
__device__ __forceinline__ void store_pack(T* p, int64_t pack, const float (&f)[V]) {
  Pack<T, V> pk;
#pragma unroll
  for (int k = 0; k < V; ++k) st<T>(pk.v, k, f[k]);
  reinterpret_cast<Pack<T, V>*>(p)[pack] = pk;
}

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535LL * 16;  // grid-stride loops cover the rest

int blocks_for(int64_t work, int64_t per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  return static_cast<int>(std::clamp<int64_t>(b, 1, kMaxBlocks));
}
int row_blocks(int64_t rows) { return static_cast<int>(std::clamp<int64_t>(rows, 1, kMaxBlocks)); }

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the sum.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  __shared__ float total;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x / 32;
    float s = lane < nwarps ? warp_sums[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

// ---- kernels -------------------------------------------------------------------------------

template <class T>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, int64_t tokens, const T* __restrict__ table,
                                 int64_t hidden, float scale, T* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const T* row = table + static_cast<int64_t>(ids[t]) * hidden;
    T* o = out + t * hidden;
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) st<T>(o, i, __fmul_rn(ld<T>(row, i), scale));
  }
}

// One block per row.  Each thread reads and writes the same elements in both passes, so
// out == x is safe.
template <class T, int V>
__global__ void rms_norm_kernel(const T* x, int64_t rows, int64_t dim, int64_t x_stride, const T* __restrict__ w,
                                float eps, bool plus_one, T* out, int64_t out_stride) {
  const int64_t packs = dim / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * x_stride;
    T* o = out + r * out_stride;
    float ss = 0.0f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float f[V];
      load_pack<T, V>(xr, p, f);
#pragma unroll
      for (int k = 0; k < V; ++k) ss = __fmaf_rn(f[k], f[k], ss);
    }
    ss = block_sum(ss);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float f[V], wv[V];
      load_pack<T, V>(xr, p, f);
      load_pack<T, V>(w, p, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) f[k] = __fmul_rn(__fmul_rn(f[k], inv), plus_one ? 1.0f + wv[k] : wv[k]);
      store_pack<T, V>(o, p, f);
    }
    __syncthreads();  // block_sum's shared total is reused by the next row
  }
}

template <class T, int V>
__global__ void add_rms_norm_kernel(const T* x, T* residual, int64_t rows, int64_t dim, const T* __restrict__ w,
                                    float eps, bool plus_one, T* out) {
  const int64_t packs = dim / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * dim;
    T* res = residual + r * dim;
    T* o = out + r * dim;
    float ss = 0.0f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float f[V], a[V];
      load_pack<T, V>(res, p, f);
      load_pack<T, V>(xr, p, a);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        f[k] = round_to<T>(__fadd_rn(f[k], a[k]));
        ss = __fmaf_rn(f[k], f[k], ss);
      }
      store_pack<T, V>(res, p, f);
    }
    ss = block_sum(ss);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float f[V], wv[V];
      load_pack<T, V>(res, p, f);
      load_pack<T, V>(w, p, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) f[k] = __fmul_rn(__fmul_rn(f[k], inv), plus_one ? 1.0f + wv[k] : wv[k]);
      store_pack<T, V>(o, p, f);
    }
    __syncthreads();
  }
}

// One block per token; threads over (head, i < half).
template <class T>
__global__ void rope_neox_kernel(T* x, int64_t tokens, int64_t heads, int64_t half, int64_t token_stride,
                                 int64_t head_stride, const int64_t* __restrict__ positions,
                                 const float* __restrict__ cos_table, const float* __restrict__ sin_table) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int64_t pos = positions[t];
    const float* c = cos_table + pos * half;
    const float* s = sin_table + pos * half;
    for (int64_t j = threadIdx.x; j < heads * half; j += blockDim.x) {
      const int64_t h = j / half, i = j - h * half;
      T* a = x + t * token_stride + h * head_stride;
      const float ai = ld<T>(a, i), bi = ld<T>(a, half + i), ci = c[i], si = s[i];
      st<T>(a, i, __fsub_rn(__fmul_rn(ai, ci), __fmul_rn(bi, si)));
      st<T>(a, half + i, __fadd_rn(__fmul_rn(bi, ci), __fmul_rn(ai, si)));
    }
  }
}

template <GatedActivation kAct>
__device__ __forceinline__ float activation(float v) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  if constexpr (kAct == GatedActivation::silu) {
    return __fdiv_rn(v, __fadd_rn(1.0f, expf(-v)));
  } else {
    const float v3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, v), v), v);
    return __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, tanhf(__fmul_rn(kC, __fadd_rn(v, v3)))));
  }
}

template <class T, int V, GatedActivation kAct>
__global__ void act_mul_kernel(const T* __restrict__ gate_up, int64_t tokens, int64_t inter, T* __restrict__ out) {
  const int64_t packs = inter / V;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const T* g = gate_up + t * 2 * inter;
    const T* u = g + inter;
    T* o = out + t * inter;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float gv[V], uv[V];
      load_pack<T, V>(g, p, gv);
      load_pack<T, V>(u, p, uv);
#pragma unroll
      for (int k = 0; k < V; ++k) gv[k] = __fmul_rn(activation<kAct>(gv[k]), uv[k]);
      store_pack<T, V>(o, p, gv);
    }
  }
}

// n / V packs (n a multiple of V).
template <class T, int V>
__global__ void add_inplace_kernel(T* __restrict__ y, const T* __restrict__ x, int64_t n) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n / V; p += int64_t(gridDim.x) * blockDim.x) {
    float a[V], b[V];
    load_pack<T, V>(y, p, a);
    load_pack<T, V>(x, p, b);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = __fadd_rn(a[k], b[k]);
    store_pack<T, V>(y, p, a);
  }
}

template <class T>
__global__ void soft_cap_kernel(T* x, int64_t n, float cap, float inv_cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st<T>(x, i, __fmul_rn(cap, tanhf(__fmul_rn(ld<T>(x, i), inv_cap))));
}

// Row copy in 16-, 4-, 2- or 1-byte words (W: the widest word that divides the row bytes and
// both base pointers' alignment).
template <class W>
__global__ void gather_rows_kernel(const W* __restrict__ x, int64_t row_words, const int64_t* __restrict__ rows,
                                   int64_t n, W* __restrict__ out) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const W* src = x + rows[i] * row_words;
    W* dst = out + i * row_words;
    for (int64_t j = threadIdx.x; j < row_words; j += blockDim.x) dst[j] = src[j];
  }
}

template <class S, class D>
__global__ void convert_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st<D>(dst, i, ld<S>(src, i));
}

template <class T>
__global__ void fill_rows_kernel(const T* __restrict__ bias, int64_t rows, int64_t n, T* __restrict__ y,
                                 int64_t ldy) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) y[r * ldy + j] = bias[j];
}

// Calls f with a null pointer of the storage type of t (float, __nv_bfloat16 or __half);
// false for any other dtype (the callers validate dtypes first).
template <class F>
bool dispatch(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(static_cast<float*>(nullptr)); return true;
    case DType::bf16: f(static_cast<__nv_bfloat16*>(nullptr)); return true;
    case DType::f16: f(static_cast<__half*>(nullptr)); return true;
    default: return false;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int launched(bool dispatched) { return dispatched ? static_cast<int>(cudaGetLastError()) : int(cudaErrorInvalidValue); }

}  // namespace

namespace kernels {

int embedding(const int32_t* ids, int64_t tokens, const void* table, int64_t hidden, float scale, void* out,
              DType t) {
  return launched(dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    embedding_kernel<T><<<row_blocks(tokens), kThreads>>>(ids, tokens, static_cast<const T*>(table), hidden, scale,
                                                          static_cast<T*>(out));
  }));
}

int rms_norm(const void* x, int64_t rows, int64_t dim, int64_t x_stride, const void* w, float eps, bool plus_one,
             void* out, int64_t out_stride, DType t) {
  return launched(dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = 16 / sizeof(T);
    const auto* xp = static_cast<const T*>(x);
    const auto* wp = static_cast<const T*>(w);
    auto* op = static_cast<T*>(out);
    if (aligned16(x) && aligned16(w) && aligned16(out) && dim % V == 0 && x_stride % V == 0 && out_stride % V == 0)
      rms_norm_kernel<T, V><<<row_blocks(rows), kThreads>>>(xp, rows, dim, x_stride, wp, eps, plus_one, op, out_stride);
    else
      rms_norm_kernel<T, 1><<<row_blocks(rows), kThreads>>>(xp, rows, dim, x_stride, wp, eps, plus_one, op, out_stride);
  }));
}

int add_rms_norm(const void* x, void* residual, int64_t rows, int64_t dim, const void* w, float eps, bool plus_one,
                 void* out, DType t) {
  return launched(dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = 16 / sizeof(T);
    const auto* xp = static_cast<const T*>(x);
    auto* rp = static_cast<T*>(residual);
    const auto* wp = static_cast<const T*>(w);
    auto* op = static_cast<T*>(out);
    if (aligned16(x) && aligned16(residual) && aligned16(w) && aligned16(out) && dim % V == 0)
      add_rms_norm_kernel<T, V><<<row_blocks(rows), kThreads>>>(xp, rp, rows, dim, wp, eps, plus_one, op);
    else
      add_rms_norm_kernel<T, 1><<<row_blocks(rows), kThreads>>>(xp, rp, rows, dim, wp, eps, plus_one, op);
  }));
}

int rope_neox(void* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride, int64_t head_stride,
              const int64_t* positions, const float* cos_table, const float* sin_table, DType t) {
  return launched(dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rope_neox_kernel<T><<<row_blocks(tokens), kThreads>>>(static_cast<T*>(x), tokens, heads, head_dim / 2,
                                                          token_stride, head_stride, positions, cos_table, sin_table);
  }));
}

int act_mul(const void* gate_up, int64_t tokens, int64_t inter, GatedActivation act, void* out, DType t) {
  return launched(dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = 16 / sizeof(T);
    const auto* g = static_cast<const T*>(gate_up);
    auto* o = static_cast<T*>(out);
    const int blocks = row_blocks(tokens);
    const bool vec = aligned16(gate_up) && aligned16(out) && inter % V == 0;
    if (act == GatedActivation::silu) {
      if (vec)
        act_mul_kernel<T, V, GatedActivation::silu><<<blocks, kThreads>>>(g, tokens, inter, o);
      else
        act_mul_kernel<T, 1, GatedActivation::silu><<<blocks, kThreads>>>(g, tokens, inter, o);
    } else {
      if (vec)
        act_mul_kernel<T, V, GatedActivation::gelu_tanh><<<blocks, kThreads>>>(g, tokens, inter, o);
      else
        act_mul_kernel<T, 1, GatedActivation::gelu_tanh><<<blocks, kThreads>>>(g, tokens, inter, o);
    }
  }));
}

int add_inplace(void* y, const void* x, int64_t n, DType t) {
  return launched(dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = 16 / sizeof(T);
    auto* yp = static_cast<T*>(y);
    const auto* xp = static_cast<const T*>(x);
    if (aligned16(y) && aligned16(x) && n % V == 0)
      add_inplace_kernel<T, V><<<blocks_for(n / V, kThreads), kThreads>>>(yp, xp, n);
    else
      add_inplace_kernel<T, 1><<<blocks_for(n, kThreads), kThreads>>>(yp, xp, n);
  }));
}

int soft_cap(void* x, int64_t n, float cap, DType t) {
  const float inv = static_cast<float>(1.0 / static_cast<double>(cap));
  return launched(dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    soft_cap_kernel<T><<<blocks_for(n, kThreads), kThreads>>>(static_cast<T*>(x), n, cap, inv);
  }));
}

int gather_rows(const void* x, int64_t bytes, const int64_t* rows, int64_t n, void* out) {
  const auto align = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out) | static_cast<uintptr_t>(bytes);
  const int blocks = row_blocks(n);
  if (align % 16 == 0) {
    gather_rows_kernel<uint4><<<blocks, kThreads>>>(static_cast<const uint4*>(x), bytes / 16, rows, n,
                                                    static_cast<uint4*>(out));
  } else if (align % 4 == 0) {
    gather_rows_kernel<uint32_t><<<blocks, kThreads>>>(static_cast<const uint32_t*>(x), bytes / 4, rows, n,
                                                       static_cast<uint32_t*>(out));
  } else if (align % 2 == 0) {
    gather_rows_kernel<uint16_t><<<blocks, kThreads>>>(static_cast<const uint16_t*>(x), bytes / 2, rows, n,
                                                       static_cast<uint16_t*>(out));
  } else {
    gather_rows_kernel<uint8_t><<<blocks, kThreads>>>(static_cast<const uint8_t*>(x), bytes, rows, n,
                                                      static_cast<uint8_t*>(out));
  }
  return launched(true);
}

int convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n) {
  bool inner = false;
  const bool outer = dispatch(src_t, [&](auto* stag) {
    using S = std::remove_pointer_t<decltype(stag)>;
    inner = dispatch(dst_t, [&](auto* dtag) {
      using D = std::remove_pointer_t<decltype(dtag)>;
      convert_kernel<S, D><<<blocks_for(n, kThreads), kThreads>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
    });
  });
  return launched(outer && inner);
}

int fill_rows(const void* bias, int64_t rows, int64_t n, void* y, int64_t ldy, DType t) {
  return launched(dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    fill_rows_kernel<T><<<row_blocks(rows), kThreads>>>(static_cast<const T*>(bias), rows, n, static_cast<T*>(y), ldy);
  }));
}

const char* error_name(int err) { return cudaGetErrorName(static_cast<cudaError_t>(err)); }
const char* error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

}  // namespace kernels

}  // namespace kvattn::model::gpu
