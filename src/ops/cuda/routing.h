// src/ops/cuda/routing.h — the settings that pick among the CUDA kernels' paths, and the two
// link-time hooks through which a test or benchmark binary overrides them and sees which path
// served a call.  No CUDA header, so g++-compiled files can include it.
//
// The library holds no mutable routing state: its settings are the defaults below, of which the
// routing fields a user or contributor may need are read once from the environment (the knob
// table of CONTRIBUTING.md: KVATTN_PREFILL, KVATTN_PREFILL_HOPPER, KVATTN_PREFILL_HOPPER_SCHED,
// KVATTN_SMALL_DECODE, KVATTN_PAGE_DECODE, KVATTN_DECODE_STREAMK) and never change afterwards.
// A test binary (tests/ops/kernel_routing_hook.cpp) or the benchmark (tools/cuda/) defines
// kernel_routing_override() and on_kernel_launch(); the library's weak definitions (routing.cpp)
// return "no override" and count nothing.
#pragma once

#include <cstdint>

namespace kvattn::ops::cuda_impl::k {

// A routing setting: automatic (the planner's rule), off (never this path), force (every call
// the path covers).
enum class Route : int { automatic = 0, off = 1, force = 2 };

// Option bits of the decode configuration of attn_kernel (Plan::opts; paged_attention.cu).
constexpr int kOptWaveSplits = 1;    // uniform-length calls split so units fill whole waves of CTAs
constexpr int kOptFp8Fast = 4;       // fp8 caches: the fast-conversion kernel (sm_90+, D <= 128)
constexpr int kOptRemSplits = 8;     // uniform lengths may take a chunk that does not divide them
constexpr int kOptStreamK = 16;      // stream-K schedule for every decode-config call
constexpr int kOptStreamKFp8 = 32;   // stream-K for fp8 caches with a (request, KV head) pair per CTA
constexpr int kOptStreamKMixed = 64; // stream-K for calls hinted as mixed lengths, same bound
constexpr int kDefaultDecodeOpts = kOptWaveSplits | kOptFp8Fast | kOptRemSplits | kOptStreamKFp8 | kOptStreamKMixed;
constexpr int kDecodeOptsMask =
    kOptWaveSplits | kOptFp8Fast | kOptRemSplits | kOptStreamK | kOptStreamKFp8 | kOptStreamKMixed;

struct KernelRouting {
  // ---- routing (environment knobs) ----
  Route prefill = Route::automatic;         // the dedicated prefill kernels (KVATTN_PREFILL)
  Route prefill_hopper = Route::automatic;  // its sm_90a TMA + wgmma form (KVATTN_PREFILL_HOPPER)
  int hopper_sched = -1;  // -1 the call's default (hopper_sched_for), 0 serial, 1 overlap, 2 pingpong, 3 turns (KVATTN_PREFILL_HOPPER_SCHED)
  Route small_decode = Route::automatic;    // the one-launch small-call decode (KVATTN_SMALL_DECODE)
  Route page_decode = Route::automatic;     // the whole-page decode (KVATTN_PAGE_DECODE)
  int decode_options = kDefaultDecodeOpts;  // kOpt* bits (KVATTN_DECODE_STREAMK=1 adds kOptStreamK)
  // ---- variants and measurement settings (tests and benchmarks only; no environment knob) ----
  int decode_splits = 0;          // >0: every request of a decode-config call in this many chunks
  int decode_chunk = 0;           // >0: the remainder rule's chunk, in tiles
  bool small_cluster = true;      // the small path may run the cluster kernel (false: attn_kernel's always)
  int small_cluster_max = 16;     // most pieces per unit of the cluster kernel (1..16)
  bool small_warps4 = false;      // the cluster kernel keeps 4 warps per CTA
  bool small_route8 = true;       // automatic routing takes calls only 8-warp clusters cover well
  bool small_page_window = true;  // the cluster kernel stages the page ids in shared memory
  int small_min_tiles = 1;        // fewest KV tiles per piece on attn_kernel's small path
  bool prefill_paired_rows = true;  // the prefill kernel's paired-row K/V loader where rows are aligned
  bool cache_write_pairs = true;  // the vectorised KV write's two-vectors-per-thread kernel
  int page_ctas = 0;              // >0: cap the whole-page decode's grid at this many CTAs
  int64_t prefill_l2_budget = 0;  // >0: the wgmma prefill plan's L2 section size in bytes (0: 5/8 of the device's L2)
  int prefill_hopper_ctas = 0;     // >0: cap the wgmma prefill's grid at this many CTAs (many units per CTA)
  int prefill_tail_split = 0;      // the wgmma prefill plan's tail cut into pieces: 0 where it pays, 1 never, 2 always
};

// What the wgmma prefill's schedule rule knows of a call on the host (no device sync).
struct HopperSchedCall {
  bool fp8_pages = false;  // fp8 K/V pages (widened to f16 by the producer warpgroup)
  bool causal = true;
  int64_t batch = 0, num_tokens = 0;
  int64_t kv_keys = -1;     // the requests' KV lengths summed (paged form: kv_indices rows x page size), -1 unknown
  int64_t window_left = -1;
};
// The consumer schedule a call takes: `setting` (KernelRouting::hopper_sched) when it names one;
// else turns where the call's units are long — 16-bit pages whose mean unit spans
// kHopperTurnsMinKeys keys or more (causal: the requests' mean context before their queries plus
// half their mean query length; capped by the window) — and pingpong otherwise (short units, fp8
// pages, KV lengths the host does not know).  Measured on an H100 (bf16, 32 / 8 heads, D 128,
// plans kept; `scripts/dev/ab_bench.sh`, medians of 5 alternated runs of `kvattn bench-cuda
// --only prefill`), turns against pingpong: the chunked step 8 x (q 512, kv 4096) +2.5 %, a long
// context's chunk 1 x (q 2048, kv 32768) +3.1 %, non-causal 8 x 2048 +1.7 %, 4 x 4096 +1.0 %,
// 1 x 8192 +0.6 %; causal 8 x 2048 and mixed lengths 16 x U[256, 4096] even (1.000, 1.003);
// 16 x 1024 -3.0 %, 32 x 512 -2.1 %, fp8 e4m3 8 x 2048 -3.5 %.  (serial ran as turns within
// 0.5 % on the long-unit shapes, 4-5 % behind on the short ones.)
constexpr int kHopperSchedPingpong = 2;
constexpr int kHopperSchedTurns = 3;
constexpr int64_t kHopperTurnsMinKeys = 12 * 128;  // 12 key tiles: 8 x 2048 causal (8) stays on pingpong
inline int hopper_sched_for(int setting, const HopperSchedCall& c) {
  if (setting >= 0 && setting < 4) return setting;
  if (c.fp8_pages || c.kv_keys < 0 || c.batch <= 0) return kHopperSchedPingpong;
  const int64_t kv = c.kv_keys / c.batch, q = c.num_tokens / c.batch;
  int64_t keys = c.causal ? (kv > q ? kv - q : 0) + q / 2 : kv;
  if (c.window_left >= 0 && keys > c.window_left + 1) keys = c.window_left + 1;
  return keys >= kHopperTurnsMinKeys ? kHopperSchedTurns : kHopperSchedPingpong;
}

// The library's settings: the defaults above with the environment's routing knobs (read once).
const KernelRouting& library_routing() noexcept;
// The settings a call runs under: the override a test or benchmark binary installs, else the
// library's.
const KernelRouting& kernel_routing() noexcept;

// What served a call, as on_kernel_launch reports it (one call may report several: a prefill
// call routed to the wgmma kernel reports prefill and prefill_wgmma).
enum class KernelLaunch : int {
  f32 = 0,            // the float32-cache SIMT kernel
  prefill,            // the prefill kernels (mma.sync or wgmma)
  prefill_wgmma,      // of which the sm_90a wgmma kernel
  page_decode,        // the whole-page decode
  small_decode,       // the small-call path (either kernel)
  small_cluster,      // of which the cluster kernel
  small_cluster_8warps,  // of which with 8 warps per CTA
  streamk,            // attn_kernel's decode config on the stream-K schedule
  fp8_fast,           // attn_kernel's fp8 fast-conversion decode
  decode,             // attn_kernel (plan kernel, persistent grid, split merge)
  count
};
// Reports a launch to the hook (reason: a static string, the planner's reason where it has one).
void note_launch(KernelLaunch what, const char* reason = "") noexcept;

// ---- link-time hooks: weak in the library; a test or benchmark binary may define them ----------
// The settings to run under instead of library_routing() (nullptr: none).
const KernelRouting* kernel_routing_override() noexcept;
// Called once per launch of a path (after the launch was enqueued without error).
void on_kernel_launch(KernelLaunch what, const char* reason) noexcept;

}  // namespace kvattn::ops::cuda_impl::k
