// src/ops/cuda/dcp_dispatch.cpp — Tensors -> the DCP kernels' parameter blocks (dcp_ops.cu).
// The entry points in src/ops/dcp_combine.cpp have checked shapes, dtypes and devices.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "kvattn/core/error.h"
#include "ops/cuda/dcp_kernels.h"
#include "ops/cuda_dispatch.h"

namespace kvattn::ops::cuda_impl {
namespace {

class Guard {  // makes the tensor's device current for the launch
 public:
  explicit Guard(const Tensor& t) {
    cudaGetDevice(&prev_);
    cur_ = t.device().index;
    if (cur_ != prev_) cudaSetDevice(cur_);
  }
  ~Guard() {
    if (cur_ != prev_) cudaSetDevice(prev_);
  }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  int prev_ = 0, cur_ = 0;
};

void check(int err, const char* op) {
  if (err == 0) return;
  throw InternalError(fmt::format("{}: CUDA kernel launch failed: error {} ({})", op, err,
                                  cudaGetErrorString(static_cast<cudaError_t>(err))));
}

k::Elt float_elt(DType t) {
  switch (t) {
    case DType::f32: return k::Elt::f32;
    case DType::f16: return k::Elt::f16;
    case DType::bf16: return k::Elt::bf16;
    case DType::fp8_e4m3: return k::Elt::e4m3;
    case DType::fp8_e5m2: return k::Elt::e5m2;
    default: break;
  }
  throw Unsupported(fmt::format("the CUDA DCP kernels do not read dtype {}", dtype_name(t)));
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  Guard g(dst);
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    const cudaError_t e = cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(dst.nbytes()),
                                          cudaMemcpyDeviceToDevice, nullptr);
    return check(static_cast<int>(e), "copy_");
  }
  k::CopyParams p;
  p.src = src.data();
  p.dst = dst.data();
  p.ndim = dst.dim();
  for (int d = 0; d < dst.dim(); ++d) {
    p.shape[d] = dst.size(d);
    p.src_stride[d] = src.stride(d);
    p.dst_stride[d] = dst.stride(d);
  }
  p.numel = dst.numel();
  if (dst.dtype() == src.dtype()) {
    p.elt_bytes = static_cast<int>(dst.element_size());
  } else {
    p.src_elt = float_elt(src.dtype());
    p.dst_elt = float_elt(dst.dtype());
  }
  check(k::launch_strided_copy(p), "copy_");
}

void dcp_lse_scale_pack(const Tensor& partial, const Tensor& all_lse, int64_t rank, bool lse_base_e,
                        const Tensor& packed, const Tensor& global_lse) {
  Guard g(partial);
  KVATTN_CHECK(all_lse.is_contiguous(), "dcp_lse_scale_pack: on CUDA `all_lse` must be contiguous, got {}",
               all_lse.str());
  k::DcpScalePackParams p;
  p.partial = partial.data();
  p.partial_elt = float_elt(partial.dtype());
  p.p_st = partial.stride(0);
  p.p_sh = partial.stride(1);
  p.p_sd = partial.stride(2);
  p.all_lse = static_cast<const float*>(all_lse.data());
  p.packed = static_cast<float*>(packed.data());
  if (global_lse.defined()) {
    p.global_lse = static_cast<float*>(global_lse.data());
    p.g_st = global_lse.stride(0);
    p.g_sh = global_lse.stride(1);
  }
  p.W = all_lse.size(0);
  p.T = partial.size(0);
  p.H = partial.size(1) / p.W;
  p.D = partial.size(2);
  p.rank = rank;
  p.base_e = lse_base_e;
  check(k::launch_dcp_lse_scale_pack(p), "dcp_lse_scale_pack");
}

void dcp_lse_combine(const Tensor& partials, const Tensor& lses, bool lse_base_e, const Tensor& out,
                     const Tensor& global_lse) {
  Guard g(partials);
  k::DcpCombineParams p;
  p.partials = partials.data();
  p.partials_elt = float_elt(partials.dtype());
  p.p_sw = partials.stride(0);
  p.p_st = partials.stride(1);
  p.p_sh = partials.stride(2);
  p.p_sd = partials.stride(3);
  p.lses = static_cast<const float*>(lses.data());
  p.l_sw = lses.stride(0);
  p.l_st = lses.stride(1);
  p.l_sh = lses.stride(2);
  p.out = out.data();
  p.out_elt = float_elt(out.dtype());
  p.o_st = out.stride(0);
  p.o_sh = out.stride(1);
  p.o_sd = out.stride(2);
  if (global_lse.defined()) {
    p.global_lse = static_cast<float*>(global_lse.data());
    p.g_st = global_lse.stride(0);
    p.g_sh = global_lse.stride(1);
  }
  p.W = partials.size(0);
  p.T = partials.size(1);
  p.H = partials.size(2);
  p.D = partials.size(3);
  p.base_e = lse_base_e;
  check(k::launch_dcp_lse_combine(p), "dcp_lse_combine");
}

}  // namespace kvattn::ops::cuda_impl
