// kvattn/core/buffer.h — an owning, aligned, untyped allocation on one device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "kvattn/core/device.h"

namespace kvattn {

class Buffer {
 public:
  // Allocates `bytes` (may be 0) aligned to `alignment` (a power of two, >= 64 on CPU; CUDA
  // allocations are 256-byte aligned).  Throws OutOfMemory (with the size asked for) on
  // failure and Unsupported for CUDA in a build without CUDA.  Contents are uninitialised.
  static std::shared_ptr<Buffer> allocate(std::size_t bytes, Device device = Device::cpu(),
                                          std::size_t alignment = 256);
  // Wraps memory owned elsewhere; `release` runs when the last reference goes (e.g. a
  // DLPack deleter).  `release` may be empty for borrowed memory.
  static std::shared_ptr<Buffer> wrap(void* data, std::size_t bytes, Device device,
                                      std::function<void()> release);

  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }
  Device device() const noexcept { return device_; }

 private:
  Buffer() = default;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_{};
  std::function<void()> release_;
};

}  // namespace kvattn
