// src/ops/cuda/hopper_prefill.h — the Hopper (sm_90a) paged prefill kernel: producer warp with
// TMA page gathers, two consumer warpgroups with wgmma (hopper_prefill.cu).  Plain C++ (no CUDA
// headers): prefill_kernel.cu asks hopper_prefill_choice() which prefill kernel serves a call and
// launches this one on its own plan tables (same 128-row tiles).
#pragma once

#include <cstdint>

#include "ops/cuda/kernels.h"

namespace kvattn::ops::cuda_impl::k {

// The plan's device tables, as prefill_kernel.cu's pf_plan_l2_kernel lays them out: req =
// [batch] of {q_start, q_len, kv_len, tile_start} (int32 x 4), page_base = [batch] int64, units =
// the list of entries the CTAs take (L2 sections, costs balanced over the CTAs:
// prefill_plan_order.h), each {request, row tile * hkv + KV head, piece, split} (int32 x 4):
// split -1 for a whole unit, else piece index << 16 | split id, for a piece of a unit cut in the
// list's tail (piece = first key tile in the unit << 16 | key tiles); request -1 is a hole (the
// CTA's list ends there).  num_items = [2]: the items (row tiles), the entries; counter = [1]
// the units drawn so far by the fp8 pages' kernels (0 between launches: set by the plan kernel,
// put back by each launch's last draw).  splits = per split id {first partial slot, pieces};
// split_count = per split id and consumer warpgroup, the pieces finished (0 between launches:
// put back by the piece that merges); partial = the pieces' results, kHopperPartialFloats per
// slot (f32 O normalised, 128 rows x 128 dims, then each row's log2 LSE), written and read within
// a launch.  splits and partial are null where the plan cuts no unit.
struct HopperPlanTables {
  const void* req = nullptr;
  const int64_t* page_base = nullptr;
  const void* units = nullptr;
  const int32_t* num_items = nullptr;
  int32_t* counter = nullptr;
  const void* splits = nullptr;
  int32_t* split_count = nullptr;
  float* partial = nullptr;
};
constexpr int64_t kHopperPartialFloats = 128 * 128 + 128;

// Which kernel serves a prefill call, and why (a static string).
enum class PrefillPath : int { mma_sync = 0, wgmma = 1 };
struct PrefillChoice {
  PrefillPath path = PrefillPath::mma_sync;
  const char* reason = "";
};

// The consumer warpgroups' schedule (KernelRouting::hopper_sched, routing.h): 0 serial (S = Q K^T,
// wait, softmax, O += P V, wait), 1 overlap (S of tile j+1 issued before the softmax of tile j,
// P V of tile j after it, each waited only when its result is needed), 2 pingpong (overlap, and
// the two warpgroups take turns at issuing their GEMMs, so one's softmax runs under the other's
// GEMMs), 3 turns (serial, with the pingpong turns around each tile's S).  Unset, a call takes
// turns where its units are long on average, else pingpong (hopper_sched_for, routing.h).  Its
// name, as KVATTN_PREFILL_HOPPER_SCHED spells it:
const char* hopper_prefill_sched_name(int sched);

// The choice for a call the prefill kernel serves (host only, no device sync).  Rows per CTA
// tile: 128, as prefill_kernel.cu's plan for head_dim 128.
PrefillChoice hopper_prefill_choice(const AttnParams& p);

// The wgmma kernel's grid for a call: one CTA per SM, never more CTAs than the call's bound on
// units (KernelRouting::prefill_hopper_ctas caps it in tests).
int hopper_prefill_grid(const AttnParams& p, int num_sms);
// The CTAs that take the plan's units round-robin (unit w to CTA w % grid: 16-bit pages), so the
// plan deals its waves to balance them; 0 where the CTAs draw their units from the plan's
// counter in list order (fp8 pages).
int hopper_prefill_round_robin_ctas(const AttnParams& p, int num_sms);

// Launches the wgmma kernel on a plan built by prefill_kernel.cu (0 = success, else a
// cudaError_t; a tensor map the driver rejects returns -1 and launches nothing).
int launch_hopper_prefill(const AttnParams& p, int num_sms, const HopperPlanTables& plan);

}  // namespace kvattn::ops::cuda_impl::k
