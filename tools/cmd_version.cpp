// `kvattn version`: the build's version and what it was built with.
#include <fmt/format.h>

#include "command_registry.h"
#include "kvattn/attention/communicator.h"
#include "kvattn/core/cuda_runtime_api.h"

namespace kvattn::tools {
namespace {

std::function<int()> setup_version(CLI::App&) {
  return [] {
    fmt::print("kvattn {}\n", KVATTN_VERSION_STRING);
    fmt::print("  CUDA kernels: {}\n", cuda::built_with_cuda() ? "built" : "not built");
    fmt::print("  NCCL DCP communicator: {}\n", NcclDcpGroup::available() ? "built" : "not built");
    if (cuda::built_with_cuda()) {
      const int n = cuda::device_count();
      fmt::print("  CUDA devices: {}\n", n);
      for (int i = 0; i < n; ++i)
        fmt::print("    cuda:{}: {} (sm_{}, {} SMs)\n", i, cuda::device_name(i), cuda::compute_capability(i),
                   cuda::multiprocessor_count(i));
    }
    return 0;
  };
}

const bool version_registered = register_command({"version", "Print the version and build features", &setup_version, 900});

}  // namespace
}  // namespace kvattn::tools
