// src/model/cuda/gemm.cpp — Gemm (device_ops.h): nn.Linear through cublasGemmEx.
//
// cuBLAS is column-major.  A row-major [R, C] matrix with row stride ld is the column-major
// [C, R] matrix with leading dimension ld, so the row-major product y[M, N] = x[M, K] · w[N, K]^T
// is the column-major product y^T[N, M] = w · x^T: A = w, seen column-major as [K, N] (lda = K),
// with op(A) = A^T; B = x, seen column-major as [K, M] (ldb = ldx), op(B) = B; C = y, seen
// column-major as [N, M] (ldc = ldy).  A bias is written into every row of y first and the GEMM
// runs with beta = 1, so x·w^T + bias is formed in f32 and rounded once (as PyTorch's addmm).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kvattn/core/error.h"
#include "model/cuda/device_kernels.h"
#include "model/cuda/device_ops.h"

namespace kvattn::model::gpu {

namespace {

// cuBLAS's recommended workspace for Hopper (32 MiB); enough for every earlier architecture.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

[[noreturn]] void throw_cublas(const char* what, cublasStatus_t s) {
  const std::string msg = fmt::format("gpu::Gemm: {} failed: cuBLAS status {} ({}: {})", what, static_cast<int>(s),
                                      cublasGetStatusName(s), cublasGetStatusString(s));
  if (s == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(msg);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) throw Unsupported(msg);
  throw InternalError(msg);
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_cublas(what, s);
}

void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  const std::string msg = fmt::format("gpu::Gemm: {} failed: CUDA error {} ({}: {})", what, static_cast<int>(e),
                                      cudaGetErrorName(e), cudaGetErrorString(e));
  if (e == cudaErrorMemoryAllocation) throw OutOfMemory(msg);
  throw InternalError(msg);
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: break;
  }
  KVATTN_ASSERT(false, "gpu::Gemm: unchecked dtype {}", dtype_name(t));
  return CUDA_R_32F;
}

cublasHandle_t as_handle(void* h) { return static_cast<cublasHandle_t>(h); }

}  // namespace

Gemm::Gemm() {
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  handle_ = h;
  try {
    check_cuda(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc of the cuBLAS workspace");
    check_cublas(cublasSetWorkspace(h, workspace_, kWorkspaceBytes), "cublasSetWorkspace");
    check_cublas(cublasSetStream(h, nullptr), "cublasSetStream");
    // Reductions (split-K) in f32 even when the output is bf16 / f16.
    check_cublas(cublasSetMathMode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                                 CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                 "cublasSetMathMode");
  } catch (...) {
    if (workspace_) cudaFree(workspace_);
    cublasDestroy(h);
    throw;
  }
}

Gemm::~Gemm() {
  if (handle_) cublasDestroy(as_handle(handle_));
  if (workspace_) cudaFree(workspace_);
}

void Gemm::linear(const void* x, int64_t M, int64_t K, int64_t ldx, const void* w, int64_t N, const void* bias,
                  void* y, int64_t ldy, DType in_t, DType out_t) {
  constexpr const char* op = "gpu::Gemm::linear";
  KVATTN_CHECK(in_t == DType::f32 || in_t == DType::bf16 || in_t == DType::f16,
               "{}: input dtype {} is not supported; valid: float32, bfloat16, float16", op, dtype_name(in_t));
  KVATTN_CHECK(out_t == in_t || out_t == DType::f32,
               "{}: output dtype {} with input dtype {}; valid: the input dtype or float32", op, dtype_name(out_t),
               dtype_name(in_t));
  KVATTN_CHECK(M >= 0 && K >= 0 && N >= 0, "{}: sizes M {}, K {}, N {} must be >= 0", op, M, K, N);
  KVATTN_CHECK(ldx >= K && ldy >= N, "{}: ldx {} must be >= K {} and ldy {} >= N {}", op, ldx, K, ldy, N);
  KVATTN_CHECK(M <= INT_MAX && K <= INT_MAX && N <= INT_MAX && ldx <= INT_MAX && ldy <= INT_MAX,
               "{}: sizes (M {}, K {}, N {}, ldx {}, ldy {}) exceed cuBLAS's 32-bit range; split the call", op, M, K,
               N, ldx, ldy);
  if (M == 0 || N == 0) return;
  if (bias) {
    check_cuda(static_cast<cudaError_t>(kernels::fill_rows(bias, M, N, y, ldy, out_t)), "the bias kernel launch");
  }
  const float alpha = 1.0f, beta = bias ? 1.0f : 0.0f;
  // f32: pedantic f32 (no TF32 or other reduced-precision inner products), so the result is a
  // plain f32 GEMM.  bf16 / f16: tensor cores with f32 accumulation.
  const cublasComputeType_t compute = in_t == DType::f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  const int k = static_cast<int>(K);
  const cublasStatus_t s =
      cublasGemmEx(as_handle(handle_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), k, &alpha, w,
                   cuda_type(in_t), std::max(k, 1), x, cuda_type(in_t), std::max(static_cast<int>(ldx), 1), &beta, y,
                   cuda_type(out_t), static_cast<int>(ldy), compute, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS)
    throw_cublas(fmt::format("cublasGemmEx (M {}, N {}, K {}, {} -> {})", M, N, K, dtype_name(in_t), dtype_name(out_t))
                     .c_str(),
                 s);
}

}  // namespace kvattn::model::gpu
