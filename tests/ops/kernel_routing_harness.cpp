// tests/ops/kernel_routing_harness.cpp — the test binaries' definitions of the library's kernel
// routing hooks (src/ops/cuda/routing.h) and the setters of kernel_routing.h.  Linked into both
// test executables of this folder (a *_harness.cpp file), so every CUDA test runs under these
// settings, which start from the library's defaults.
#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>

#include "kernel_routing.h"
#include "ops/cuda/kernels.h"

namespace kvattn::ops::cuda_impl {
namespace {

using k::KernelLaunch;
using k::Route;

struct State {
  k::KernelRouting routing;
  std::array<std::atomic<int64_t>, static_cast<size_t>(KernelLaunch::count)> launches{};
  std::mutex mu;
  int last_prefill_path = -1;
  const char* last_prefill_reason = "no prefill call yet";
};
State& state() {
  static State s;
  return s;
}
k::KernelRouting& routing() { return state().routing; }
int64_t launches(KernelLaunch what) {
  return state().launches[static_cast<size_t>(what)].load(std::memory_order_relaxed);
}
Route route_of(int mode) { return mode == 1 ? Route::off : mode == 2 ? Route::force : Route::automatic; }

}  // namespace

void reset_kernel_routing() { routing() = k::KernelRouting{}; }

void set_prefill_kernel_mode(int mode) { routing().prefill = route_of(mode); }
int prefill_kernel_mode() noexcept { return static_cast<int>(routing().prefill); }
void set_prefill_hopper_mode(int mode) { routing().prefill_hopper = route_of(mode); }
int prefill_hopper_mode() noexcept { return static_cast<int>(routing().prefill_hopper); }
void set_prefill_hopper_sched(int sched) {
  routing().hopper_sched = sched >= 0 && sched < 4 ? sched : k::KernelRouting{}.hopper_sched;
}
void set_prefill_paired_rows(bool on) { routing().prefill_paired_rows = on; }
void set_prefill_l2_budget(int64_t bytes) { routing().prefill_l2_budget = bytes > 0 ? bytes : 0; }
void set_prefill_hopper_ctas(int ctas) { routing().prefill_hopper_ctas = ctas > 0 ? ctas : 0; }
void set_prefill_tail_split(int mode) { routing().prefill_tail_split = mode >= 0 && mode <= 2 ? mode : 0; }
bool prefill_paired_rows() noexcept { return routing().prefill_paired_rows; }
int64_t prefill_kernel_launches() noexcept { return launches(KernelLaunch::prefill); }
int64_t prefill_hopper_launches() noexcept { return launches(KernelLaunch::prefill_wgmma); }
int last_prefill_kernel_path() noexcept {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().last_prefill_path;
}
const char* last_prefill_kernel_reason() noexcept {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().last_prefill_reason;
}

void set_small_decode_mode(int mode) { routing().small_decode = route_of(mode); }
int small_decode_mode() noexcept { return static_cast<int>(routing().small_decode); }
int64_t small_decode_launches() noexcept { return launches(KernelLaunch::small_decode); }
void set_small_decode_kernel(int kernel) { routing().small_cluster = kernel == 0; }
int64_t small_cluster_launches() noexcept { return launches(KernelLaunch::small_cluster); }
int64_t small_cluster_launches_8warps() noexcept { return launches(KernelLaunch::small_cluster_8warps); }
void set_small_cluster_max(int pieces) { routing().small_cluster_max = std::clamp(pieces, 1, 16); }
int small_cluster_max() noexcept { return routing().small_cluster_max; }
void set_small_page_window(bool on) { routing().small_page_window = on; }
bool small_page_window() noexcept { return routing().small_page_window; }
void set_small_warps(int warps) { routing().small_warps4 = warps == 4; }
int small_warps() noexcept { return routing().small_warps4 ? 4 : 0; }
void set_small_route8(bool on) { routing().small_route8 = on; }

void set_page_decode_mode(int mode) { routing().page_decode = route_of(mode); }
int page_decode_mode() noexcept { return static_cast<int>(routing().page_decode); }
int64_t page_decode_launches() noexcept { return launches(KernelLaunch::page_decode); }

void set_decode_options(int opts) { routing().decode_options = opts & k::kDecodeOptsMask; }
int decode_options() noexcept { return routing().decode_options; }
void set_decode_splits(int n) { routing().decode_splits = std::max(0, n); }
void set_decode_chunk(int tiles) { routing().decode_chunk = std::max(0, tiles); }
int64_t fp8_fast_launches() noexcept { return launches(KernelLaunch::fp8_fast); }
int64_t streamk_launches() noexcept { return launches(KernelLaunch::streamk); }
int64_t rem_split_plans() noexcept {
#if defined(KVATTN_WITH_CUDA)
  return k::rem_split_plans();
#else
  return 0;
#endif
}

void set_cache_write_variant(int v) { routing().cache_write_pairs = v != 0; }
int cache_write_variant() noexcept { return routing().cache_write_pairs ? 1 : 0; }

int64_t f32_attention_launches() noexcept { return launches(KernelLaunch::f32); }

namespace k {
// The link-time hooks (routing.h): this binary's settings, and its launch counts.
const KernelRouting* kernel_routing_override() noexcept { return &routing(); }
void on_kernel_launch(KernelLaunch what, const char* reason) noexcept {
  State& s = state();
  s.launches[static_cast<size_t>(what)].fetch_add(1, std::memory_order_relaxed);
  if (what == KernelLaunch::prefill || what == KernelLaunch::prefill_wgmma) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.last_prefill_path = what == KernelLaunch::prefill_wgmma ? 1 : 0;
    s.last_prefill_reason = reason;
  }
}
}  // namespace k

}  // namespace kvattn::ops::cuda_impl
