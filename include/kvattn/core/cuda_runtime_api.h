// kvattn/core/cuda_runtime_api.h — the few CUDA runtime calls host code needs, behind plain
// C++ declarations.  Implemented in src/core/cuda/ when built with CUDA; otherwise every
// call except cuda_available()/cuda_device_count() throws Unsupported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvattn::cuda {

// True when this build has CUDA support compiled in.
bool built_with_cuda() noexcept;
// True when built with CUDA *and* a device is present and usable.
bool available() noexcept;
int device_count() noexcept;
// Name and compute capability (major*10+minor) of device `index`.
std::string device_name(int index);
int compute_capability(int index);
int multiprocessor_count(int index);
// Total memory of device `index` in bytes (cudaDeviceProp::totalGlobalMem).
int64_t total_memory(int index);

void* malloc(std::size_t bytes, int device);
void free(void* p, int device) noexcept;
// This process's bytes from device `device`'s allocation pool (what malloc above hands out):
// in use now, and the most in use since the last reset_pool_peak (or since the pool's start).
// 0 on a device without memory pools (malloc then uses plain cudaMalloc, which no pool counts).
int64_t pool_bytes_in_use(int device);
int64_t pool_peak_bytes(int device);
void reset_pool_peak(int device);
// Copy kinds resolved from the pointer attributes (cudaMemcpyDefault).
void memcpy(void* dst, const void* src, std::size_t bytes);
void memset(void* dst, int value, std::size_t bytes);
void synchronize();  // the calling thread's current device
// The calling thread's current device (a new thread starts on device 0).
void set_device(int device);

}  // namespace kvattn::cuda
