// CUDA runtime entry points (compiled only when KVATTN_CUDA is on; plain C++ against the
// CUDA runtime API, so g++ compiles it and fmt's compile-time format checks work).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
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
int64_t total_memory(int index) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
  return static_cast<int64_t>(p.totalGlobalMem);
}
// Device memory comes from each device's stream-ordered pool (cudaMallocAsync on the legacy
// default stream, which every kvattn kernel and NCCL call uses): a freed block goes back to the
// pool, not to the driver, so the temporaries of a step (gathered queries, partial outputs, LSE,
// packed collective buffers) cost no cudaMalloc/cudaFree, and cudaFree's device-wide
// synchronisation is gone.  The pool keeps what it has (release threshold = max); on an
// allocation failure it is trimmed and the allocation retried once before OutOfMemory.
// Devices without memory-pool support use plain cudaMalloc/cudaFree.
namespace {
constexpr int kMaxDevices = 64;
// 0 = not yet looked at, 1 = pool in use, 2 = plain cudaMalloc.
std::atomic<int> g_pool_state[kMaxDevices];

bool use_pool(int device) {
  if (device < 0 || device >= kMaxDevices) return false;
  int s = g_pool_state[device].load(std::memory_order_acquire);
  if (s != 0) return s == 1;
  int supported = 0;
  cudaMemPool_t pool = nullptr;
  bool ok = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess &&
            supported != 0 && cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess;
  if (ok) {
    std::uint64_t keep = UINT64_MAX;
    ok = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess;
  }
  (void)cudaGetLastError();
  s = ok ? 1 : 2;
  g_pool_state[device].store(s, std::memory_order_release);
  return s == 1;
}

cudaError_t allocate(void** p, std::size_t bytes, bool pooled) {
  return pooled ? cudaMallocAsync(p, bytes, cudaStreamLegacy) : cudaMalloc(p, bytes);
}
}  // namespace

void* malloc(std::size_t bytes, int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  const bool pooled = use_pool(device);
  void* p = nullptr;
  cudaError_t e = allocate(&p, bytes, pooled);
  if (e == cudaErrorMemoryAllocation && pooled) {
    // Blocks the pool holds for reuse may be what is missing: give them back and retry once.
    (void)cudaGetLastError();
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceSynchronize() == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess)
      (void)cudaMemPoolTrimTo(pool, 0);
    e = allocate(&p, bytes, pooled);
  }
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw OutOfMemory(fmt::format("could not allocate {} bytes on cuda:{}; lower the memory "
                                  "budget (--gpu-memory) or the number of blocks", bytes, device));
  }
  check(e, pooled ? "cudaMallocAsync" : "cudaMalloc");
  return p;
}
void free(void* p, int device) noexcept {
  int prev = -1;
  (void)cudaGetDevice(&prev);
  if (prev != device) (void)cudaSetDevice(device);
  if (use_pool(device))
    (void)cudaFreeAsync(p, cudaStreamLegacy);
  else
    (void)cudaFree(p);
  if (prev != device && prev >= 0) (void)cudaSetDevice(prev);
}
namespace {
// The pool malloc draws from on `device` (only where use_pool(device)).
cudaMemPool_t default_pool(int device) {
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  return pool;
}
// The pool's counter `attr` (a uint64 attribute); 0 on a device malloc does not pool.
int64_t pool_counter(int device, cudaMemPoolAttr attr) {
  if (!use_pool(device)) return 0;
  std::uint64_t v = 0;
  check(cudaMemPoolGetAttribute(default_pool(device), attr, &v), "cudaMemPoolGetAttribute");
  return static_cast<int64_t>(v);
}
}  // namespace
int64_t pool_bytes_in_use(int device) { return pool_counter(device, cudaMemPoolAttrUsedMemCurrent); }
int64_t pool_peak_bytes(int device) { return pool_counter(device, cudaMemPoolAttrUsedMemHigh); }
void reset_pool_peak(int device) {
  if (!use_pool(device)) return;
  std::uint64_t zero = 0;  // the only value the high watermark can be set to: it restarts from there
  check(cudaMemPoolSetAttribute(default_pool(device), cudaMemPoolAttrUsedMemHigh, &zero), "cudaMemPoolSetAttribute");
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
