// CUDA runtime entry points (compiled only when KVATTN_CUDA is on; plain C++ against the
// CUDA runtime API, so g++ compiles it and fmt's compile-time format checks work).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/error.h"

namespace kvattn::cuda {
namespace {
void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  if (e == cudaErrorMemoryAllocation)
    throw OutOfMemory(fmt::format("{}: {}", what, cudaGetErrorString(e)));
  throw InternalError(fmt::format("{}: CUDA error {} ({})", what, static_cast<int>(e),
                                  cudaGetErrorString(e)));
}
}  // namespace

bool built_with_cuda() noexcept { return true; }
int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}
bool available() noexcept { return device_count() > 0; }
std::string device_name(int index) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
  return p.name;
}
int compute_capability(int index) {
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index), "cudaDeviceGetAttribute");
  return major * 10 + minor;
}
int multiprocessor_count(int index) {
  int n = 0;
  check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, index), "cudaDeviceGetAttribute");
  return n;
}
void* malloc(std::size_t bytes, int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw OutOfMemory(fmt::format("could not allocate {} bytes on cuda:{}; lower the memory "
                                  "budget (--gpu-memory) or the number of blocks", bytes, device));
  }
  check(e, "cudaMalloc");
  return p;
}
void free(void* p, int device) noexcept {
  (void)cudaSetDevice(device);
  (void)cudaFree(p);
}
void memcpy(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
}
void memset(void* dst, int value, std::size_t bytes) {
  check(cudaMemset(dst, value, bytes), "cudaMemset");
}
void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

}  // namespace kvattn::cuda
