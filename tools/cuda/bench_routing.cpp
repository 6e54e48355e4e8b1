// tools/cuda/bench_routing.cpp — the kvattn tool's definitions of the library's kernel routing
// hooks (bench_routing.h).
#include "cuda/bench_routing.h"

#include <mutex>

namespace kvattn::tools::cuda_bench {
namespace {
namespace k = ops::cuda_impl::k;

struct State {
  k::KernelRouting routing = k::library_routing();
  std::mutex mu;
  PrefillServed prefill;
};
State& state() {
  static State s;
  return s;
}
}  // namespace

k::KernelRouting& routing() { return state().routing; }
void reset_routing() { state().routing = k::library_routing(); }
PrefillServed last_prefill() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().prefill;
}
void reset_last_prefill() {
  std::lock_guard<std::mutex> lock(state().mu);
  state().prefill = PrefillServed{};
}

}  // namespace kvattn::tools::cuda_bench

namespace kvattn::ops::cuda_impl::k {
const KernelRouting* kernel_routing_override() noexcept { return &tools::cuda_bench::routing(); }
void on_kernel_launch(KernelLaunch what, const char* reason) noexcept {
  if (what != KernelLaunch::prefill && what != KernelLaunch::prefill_wgmma) return;
  auto& s = tools::cuda_bench::state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.prefill.wgmma = what == KernelLaunch::prefill_wgmma;
  s.prefill.reason = reason;
}
}  // namespace kvattn::ops::cuda_impl::k
