#include "kvattn/batch/cpu_gpu_buffer.h"

namespace kvattn {

CpuGpuBuffer::CpuGpuBuffer(const Dims& shape, DType dtype, Device device) {
  KVATTN_CHECK(shape.size() >= 1 && shape[0] >= 0, "CpuGpuBuffer: shape {} needs a row dimension",
               shape.str());
  cpu_ = Tensor::zeros(shape, dtype, Device::cpu());
  if (device.is_cpu()) {
    gpu_ = cpu_;
    aliased_ = true;
  } else {
    gpu_ = Tensor::zeros(shape, dtype, device);
    aliased_ = false;
  }
}

Tensor CpuGpuBuffer::cpu_rows(int64_t n) const {
  KVATTN_CHECK(n >= 0 && n <= capacity(), "CpuGpuBuffer: {} rows requested, capacity is {}; raise "
               "the limit the buffer was sized from", n, capacity());
  return cpu_.slice(0, 0, n);
}

Tensor CpuGpuBuffer::gpu_rows(int64_t n) const {
  KVATTN_CHECK(n >= 0 && n <= capacity(), "CpuGpuBuffer: {} rows requested, capacity is {}; raise "
               "the limit the buffer was sized from", n, capacity());
  return gpu_.slice(0, 0, n);
}

Tensor CpuGpuBuffer::copy_to_gpu(int64_t n) {
  Tensor dst = gpu_rows(n);
  if (!aliased_) dst.copy_from(cpu_rows(n));
  return dst;
}

}  // namespace kvattn
