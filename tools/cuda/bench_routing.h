// tools/cuda/bench_routing.h — the kernel routing `kvattn bench-cuda --diagnostics` changes
// between rows (A/B of paths and variants in one process), through the library's link-time hooks
// (src/ops/cuda/routing.h).  Part of the kvattn tool, not of the library: the settings start as
// the library's (defaults and environment) and only bench-cuda's diagnostic rows change them.
#pragma once

#include "ops/cuda/routing.h"

namespace kvattn::tools::cuda_bench {

// The settings the tool's calls run under (mutable; restore what you change).
ops::cuda_impl::k::KernelRouting& routing();
// Sets every field back to the library's settings.
void reset_routing();

// The last prefill-routed call's kernel (true: wgmma) and the planner's reason.
struct PrefillServed {
  bool wgmma = false;
  const char* reason = "no prefill call yet";
};
PrefillServed last_prefill();
// Forgets the last prefill-routed call (a row whose call may not reach the prefill kernels).
void reset_last_prefill();

}  // namespace kvattn::tools::cuda_bench
