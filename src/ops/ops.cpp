// ops.h's own entry points: the CPU thread pool and whether this build has the CUDA ops.
#include "kvattn/ops/ops.h"

#include "ops/cpu/thread_pool.h"
#include "ops/cuda_dispatch.h"

namespace kvattn::ops {

void set_cpu_num_threads(int n) { cpu::ThreadPool::instance().set_num_threads(n); }
int cpu_num_threads() { return cpu::ThreadPool::instance().num_threads(); }
bool cuda_ops_available() noexcept { return cuda_impl::available(); }

}  // namespace kvattn::ops
