// src/ops/cuda/routing.cpp — the library's kernel routing settings (routing.h): defaults, the
// environment's routing knobs read once, and the weak hooks a test or benchmark binary replaces.
#include "ops/cuda/routing.h"

#include <cstdlib>
#include <cstring>

namespace kvattn::ops::cuda_impl::k {
namespace {

// unset or anything else: automatic; "off"; "force"
Route route_env(const char* name) {
  const char* e = std::getenv(name);
  if (e == nullptr) return Route::automatic;
  return std::strcmp(e, "off") == 0 ? Route::off : std::strcmp(e, "force") == 0 ? Route::force : Route::automatic;
}

KernelRouting from_environment() {
  KernelRouting r;
  r.prefill = route_env("KVATTN_PREFILL");
  r.prefill_hopper = route_env("KVATTN_PREFILL_HOPPER");
  r.small_decode = route_env("KVATTN_SMALL_DECODE");
  r.page_decode = route_env("KVATTN_PAGE_DECODE");
  if (const char* e = std::getenv("KVATTN_PREFILL_HOPPER_SCHED")) {
    static constexpr const char* kNames[] = {"serial", "overlap", "pingpong", "turns"};
    for (int i = 0; i < 4; ++i)
      if (std::strcmp(e, kNames[i]) == 0) r.hopper_sched = i;
  }
  if (const char* e = std::getenv("KVATTN_DECODE_STREAMK"); e != nullptr && std::atoi(e) != 0)
    r.decode_options |= kOptStreamK;
  return r;
}

}  // namespace

const KernelRouting& library_routing() noexcept {
  static const KernelRouting r = from_environment();
  return r;
}

const KernelRouting& kernel_routing() noexcept {
  const KernelRouting* o = kernel_routing_override();
  return o != nullptr ? *o : library_routing();
}

void note_launch(KernelLaunch what, const char* reason) noexcept { on_kernel_launch(what, reason); }

__attribute__((weak)) const KernelRouting* kernel_routing_override() noexcept { return nullptr; }
__attribute__((weak)) void on_kernel_launch(KernelLaunch, const char*) noexcept {}

}  // namespace kvattn::ops::cuda_impl::k
