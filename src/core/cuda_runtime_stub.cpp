// CUDA runtime entry points for builds without CUDA: report "not available" and throw
// Unsupported for anything that would touch a GPU.
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/error.h"

namespace kvattn::cuda {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Unsupported(std::string(what) +
                    ": this kvattn build has no CUDA support; rebuild with -DKVATTN_CUDA=ON "
                    "(needs nvcc) or use device 'cpu'");
}
}  // namespace

bool built_with_cuda() noexcept { return false; }
bool available() noexcept { return false; }
int device_count() noexcept { return 0; }
std::string device_name(int) { no_cuda("cuda::device_name"); }
int compute_capability(int) { no_cuda("cuda::compute_capability"); }
int multiprocessor_count(int) { no_cuda("cuda::multiprocessor_count"); }
int64_t total_memory(int) { no_cuda("cuda::total_memory"); }
void* malloc(std::size_t, int) { no_cuda("cuda::malloc"); }
void free(void*, int) noexcept {}
int64_t pool_bytes_in_use(int) { no_cuda("cuda::pool_bytes_in_use"); }
int64_t pool_peak_bytes(int) { no_cuda("cuda::pool_peak_bytes"); }
void reset_pool_peak(int) { no_cuda("cuda::reset_pool_peak"); }
void memcpy(void*, const void*, std::size_t) { no_cuda("cuda::memcpy"); }
void memset(void*, int, std::size_t) { no_cuda("cuda::memset"); }
void synchronize() { no_cuda("cuda::synchronize"); }
void set_device(int) { no_cuda("cuda::set_device"); }

}  // namespace kvattn::cuda
