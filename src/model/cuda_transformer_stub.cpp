// Builds without CUDA: the CUDA forward says so.  (Files ending in _stub.cpp are left out of
// CUDA builds; src/model/cuda/cuda_transformer.cpp is the real one there.)
#include <fmt/format.h>

#include "kvattn/core/error.h"
#include "model/cuda/cuda_transformer.h"

namespace kvattn::model {

namespace {
[[noreturn]] void no_cuda(Device device) {
  throw Unsupported(fmt::format("--device {}: kvattn was built without CUDA, so it runs models on the CPU only; use "
                                "--device cpu, or rebuild with -DKVATTN_CUDA=ON on a machine with the CUDA toolkit",
                                device.str()));
}
}  // namespace

struct CudaTransformer::State {};

DeviceMemoryInfo device_memory_info(Device device) { no_cuda(device); }

CudaTransformer::CudaTransformer(const HfModelConfig&, ArchTraits, const WeightStore&, Device device, DType, int64_t,
                                 int64_t, int64_t) {
  no_cuda(device);
}
CudaTransformer::~CudaTransformer() = default;
int64_t CudaTransformer::weight_bytes() const noexcept { return 0; }
int64_t CudaTransformer::activation_bytes() const noexcept { return 0; }
void CudaTransformer::forward(std::span<const int32_t>, std::span<const int64_t>, AttentionRunner&,
                              std::span<const int64_t>, float*) {
  no_cuda(Device::cuda());
}

}  // namespace kvattn::model
