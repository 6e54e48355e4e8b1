// src/ops/cuda/dcp_kernels.h — parameter blocks and launchers of the DCP kernels
// (dcp_ops.cu): the strided copy and the two LSE-weighted combines.  Plain C++.
#pragma once

#include <cstdint>

#include "ops/cuda/kernels.h"

namespace kvattn::ops::cuda_impl::k {

// Strided N-D copy.  elt_bytes > 0: same dtype, raw elements of that size (1/2/4/8);
// elt_bytes == 0: float conversion src_elt -> dst_elt.
struct CopyParams {
  const void* src = nullptr;
  void* dst = nullptr;
  int ndim = 0;
  int64_t shape[8] = {};
  int64_t src_stride[8] = {};  // elements
  int64_t dst_stride[8] = {};
  int64_t numel = 0;
  int elt_bytes = 0;                          // > 0: raw copy of equal dtypes
  Elt src_elt = Elt::f32, dst_elt = Elt::f32;  // elt_bytes == 0: convert through f32 ...
  float scale = 1.0f;                          // ... times scale
};
int launch_strided_copy(const CopyParams& p);

// Rows are (t, head); both kernels give each row one warp.
struct DcpScalePackParams {
  const void* partial = nullptr;  // [T, W*H, D]
  Elt partial_elt = Elt::f32;
  int64_t p_st = 0, p_sh = 0, p_sd = 1;
  const float* all_lse = nullptr;  // [W, T, W*H] contiguous
  float* packed = nullptr;         // [W, T, H, D] contiguous
  float* global_lse = nullptr;     // optional [T, W*H]
  int64_t g_st = 0, g_sh = 1;
  int64_t W = 1, T = 0, H = 0, D = 0, rank = 0;
  bool base_e = false;
};
int launch_dcp_lse_scale_pack(const DcpScalePackParams& p);

struct DcpCombineParams {
  const void* partials = nullptr;  // [W, T, H, D]
  Elt partials_elt = Elt::f32;
  int64_t p_sw = 0, p_st = 0, p_sh = 0, p_sd = 1;
  const float* lses = nullptr;  // [W, T, H]
  int64_t l_sw = 0, l_st = 0, l_sh = 1;
  void* out = nullptr;  // [T, H, D]
  Elt out_elt = Elt::f32;
  int64_t o_st = 0, o_sh = 0, o_sd = 1;
  float* global_lse = nullptr;  // optional [T, H]
  int64_t g_st = 0, g_sh = 1;
  int64_t W = 1, T = 0, H = 0, D = 0;
  bool base_e = false;
};
int launch_dcp_lse_combine(const DcpCombineParams& p);

}  // namespace kvattn::ops::cuda_impl::k
