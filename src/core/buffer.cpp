#include "kvattn/core/buffer.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/error.h"

namespace kvattn {

std::shared_ptr<Buffer> Buffer::allocate(std::size_t bytes, Device device, std::size_t alignment) {
  KVATTN_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0,
               "Buffer alignment must be a power of two, got {}", alignment);
  std::shared_ptr<Buffer> b(new Buffer());
  b->bytes_ = bytes;
  b->device_ = device;
  if (device.is_cpu()) {
    if (alignment < 64) alignment = 64;
    if (bytes > SIZE_MAX - alignment)
      throw OutOfMemory(fmt::format("could not allocate {} bytes of host memory (more than the address space); "
                                    "reduce the request",
                                    bytes));
    // aligned_alloc needs a size that is a multiple of the alignment; never 0.
    const std::size_t rounded = ((bytes + alignment - 1) / alignment) * alignment;
    void* p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
    if (p == nullptr)
      throw OutOfMemory(fmt::format("could not allocate {} bytes of host memory; reduce the "
                                    "request (e.g. a smaller memory budget or fewer blocks)",
                                    bytes));
    b->data_ = p;
    b->release_ = [p] { std::free(p); };
  } else {
    void* p = cuda::malloc(bytes == 0 ? 1 : bytes, device.index);
    b->data_ = p;
    const int idx = device.index;
    b->release_ = [p, idx] { cuda::free(p, idx); };
  }
  return b;
}

std::shared_ptr<Buffer> Buffer::wrap(void* data, std::size_t bytes, Device device,
                                     std::function<void()> release) {
  std::shared_ptr<Buffer> b(new Buffer());
  b->data_ = data;
  b->bytes_ = bytes;
  b->device_ = device;
  b->release_ = std::move(release);
  return b;
}

Buffer::~Buffer() {
  if (release_) release_();
}

}  // namespace kvattn
