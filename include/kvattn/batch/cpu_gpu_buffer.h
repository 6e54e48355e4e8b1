// kvattn/batch/cpu_gpu_buffer.h — a persistent host staging tensor paired with its device
// copy (vLLM's CpuGpuBuffer).
//
// Allocated once at the maximum size a step can need; every step writes the host side in place
// and copies the used prefix to the device.  When the device is the CPU the two sides are the
// same memory (`gpu` aliases `cpu`) and copy_to_gpu is a no-op view.
#pragma once

#include <cstdint>
#include <span>

#include "kvattn/core/tensor.h"

namespace kvattn {

class CpuGpuBuffer {
 public:
  CpuGpuBuffer() = default;
  // shape[0] is the row capacity; contents are zero-initialised.
  CpuGpuBuffer(const Dims& shape, DType dtype, Device device);

  const Tensor& cpu() const noexcept { return cpu_; }
  const Tensor& gpu() const noexcept { return gpu_; }
  Device device() const noexcept { return gpu_.device(); }
  bool aliased() const noexcept { return aliased_; }
  int64_t capacity() const noexcept { return cpu_.defined() ? cpu_.size(0) : 0; }

  // Raw host pointer (the numpy view of vLLM's buffer).
  template <typename T>
  T* np() const {
    return cpu_.data_ptr<T>();
  }

  // Host rows [0, n) (a view).
  Tensor cpu_rows(int64_t n) const;
  // Device rows [0, n) (a view; same memory as cpu_rows when aliased).
  Tensor gpu_rows(int64_t n) const;
  // Copies host rows [0, n) to the device and returns the device view of them.  No copy when
  // aliased.  n outside [0, capacity] is an InvalidArgument.
  Tensor copy_to_gpu(int64_t n);

 private:
  Tensor cpu_;
  Tensor gpu_;
  bool aliased_ = true;
};

}  // namespace kvattn
