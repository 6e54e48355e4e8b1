// tests/ops/kernel_routing.h — test-scoped kernel routing for the CUDA op tests.
//
// The library keeps no mutable routing state (src/ops/cuda/routing.h): its settings are fixed
// defaults plus the environment's routing knobs.  Test binaries link kernel_routing_harness.cpp,
// which defines the library's two link-time hooks: kernel_routing_override() returns the settings
// these setters change (starting from the defaults, not the environment), and on_kernel_launch()
// counts which path served each call.  Modes: 0 automatic, 1 off, 2 force.  In a build without
// CUDA the setters change nothing the library reads and every counter stays 0.
#pragma once

#include <cstdint>

#include "ops/cuda/routing.h"

namespace kvattn::ops::cuda_impl {

// Every setting back to the library's defaults.
void reset_kernel_routing();

// The prefill kernels (prefill_kernel.cu), their sm_90a wgmma form (hopper_prefill.cu) and its
// consumer schedule (0 serial, 1 overlap, 2 pingpong, 3 turns; -1 the call's default:
// hopper_sched_for).
void set_prefill_kernel_mode(int mode);
int prefill_kernel_mode() noexcept;
void set_prefill_hopper_mode(int mode);
int prefill_hopper_mode() noexcept;
void set_prefill_hopper_sched(int sched);
// The prefill kernel's paired-row K/V loader (default on where rows are aligned; off: the
// flag-bit loader for every call).
void set_prefill_paired_rows(bool on);
bool prefill_paired_rows() noexcept;
// The wgmma kernel's plan: bytes of K/V per L2 section (0: the default, 5/8 of the device's L2).
void set_prefill_l2_budget(int64_t bytes);
// The wgmma kernel's grid capped at this many CTAs (0: no cap), so each CTA takes many units.
void set_prefill_hopper_ctas(int ctas);
// The wgmma plan's tail cut into pieces on several CTAs: 0 where it pays (default), 1 never, 2 always.
void set_prefill_tail_split(int mode);
int64_t prefill_kernel_launches() noexcept;
int64_t prefill_hopper_launches() noexcept;
// The last prefill-routed call's kernel (1 wgmma, 0 mma.sync, -1 none yet) and why.
int last_prefill_kernel_path() noexcept;
const char* last_prefill_kernel_reason() noexcept;

// The small-call decode path and its kernels (kernel 0: the cluster kernel where it fits, 1:
// attn_kernel's small form always).
void set_small_decode_mode(int mode);
int small_decode_mode() noexcept;
int64_t small_decode_launches() noexcept;
void set_small_decode_kernel(int kernel);
int64_t small_cluster_launches() noexcept;
int64_t small_cluster_launches_8warps() noexcept;
void set_small_cluster_max(int pieces);
int small_cluster_max() noexcept;
void set_small_page_window(bool on);
bool small_page_window() noexcept;
void set_small_warps(int warps);  // 0 automatic, 4 always 4
int small_warps() noexcept;
void set_small_route8(bool on);

// The whole-page decode path.
void set_page_decode_mode(int mode);
int page_decode_mode() noexcept;
int64_t page_decode_launches() noexcept;

// attn_kernel's decode configuration: option bits (routing.h kOpt*), forced splits and chunk.
void set_decode_options(int opts);
int decode_options() noexcept;
void set_decode_splits(int n);
void set_decode_chunk(int tiles);
int64_t fp8_fast_launches() noexcept;
int64_t streamk_launches() noexcept;
int64_t rem_split_plans() noexcept;  // plans (current device) that chose a non-dividing chunk; syncs

// The vectorised KV write: 1 two vectors per thread (default), 0 one.
void set_cache_write_variant(int v);
int cache_write_variant() noexcept;

int64_t f32_attention_launches() noexcept;

}  // namespace kvattn::ops::cuda_impl
