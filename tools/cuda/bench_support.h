// tools/cuda/bench_support.h — the ceilings, probes and event timing of `kvattn bench-cuda`
// (bench_support.cu).  Part of the kvattn tool, not of the library.  No CUDA header.
#pragma once

#include <cstdint>
#include <string>

namespace kvattn::tools::cuda_bench {

// Diagnostic settings of the measurements (bench-cuda's options; defaults: off).
struct Settings {
  int iters = 0;               // --iters: timed calls per row instead of the row's count
  int spaced_us = 0;           // --spaced-us: each timed call after this many us of idle device
  bool loop_mean = false;      // --loop-mean: one event pair around all the calls, the mean
  int gather_ctas = 0;         // --gather-ctas: cap the bulk-copy gather ceiling's grid
  std::string gather_timeline; // --gather-timeline: append the bulk-copy gather's per-CTA stamps (CSV)
};
Settings& settings();

// Median device time (microseconds, CUDA events) of fn(i) over `iters` calls after `warmup`
// (Settings::loop_mean: the mean of one event pair around all the calls instead).
double time_median_us(void (*fn)(void*, int), void* ctx, int warmup, int iters);
// Device-to-device copy of `bytes` (TB/s counting bytes read + written).
double measure_copy_tbps(int64_t bytes);
// Peak of mma.sync m16n8k16 bf16 (f32 accumulate) with operands in registers (TFLOP/s): the
// matrix-unit ceiling of the mma.sync kernels.
double measure_mma_tflops();
// Event time per launch of an empty kernel (`ctas` CTAs of 128 threads in clusters of
// `cluster`; cluster 1 = no cluster attribute), back to back as bench-cuda times the ops: the
// floor of a one-launch op's event time.
double measure_empty_launch_us(int ctas, int cluster);
// out = a + b over three `bytes` buffers (4 sets rotated): merge_attn_states' memory pattern
// (two streams read, one written) without its arithmetic (TB/s of bytes read + written).
double measure_stream3_tbps(int64_t bytes);
// The K and V rows (256 bytes: bf16, D 128) that decode reads for `batch` requests of `tiles`
// 64-key tiles each (page ids: indices, 4 pages of 16 keys per tile, request-major), KV heads
// hkv, in the decode's unit order, loads only (TB/s of bytes read): a lower bound of that access
// pattern's read ceiling.  Byte strides of a page, a slot and a head of the K / V views;
// tiles % 8 == 0 (else 0 is returned).  mode 0: one CTA per (request, 8 tiles, KV head); 1 (ranges): a
// resident grid, each CTA one contiguous range of the call's tiles (no unit-size tail, no late
// CTA starts: what a perfectly balanced schedule would read); 2 (pages): the same balance over
// whole pages, every KV head's rows of a page read together (slot_b * 16 contiguous bytes of K
// and of V per page, as in the NHD pool) — the pattern of a decode that reads a page once for all
// its KV heads; 3 (pages, bulk copy): mode 2's pages moved by the bulk copy engine into a 3-stage
// shared-memory ring, one CTA per SM (sm_90+, 16-slot pages of 8 heads x 256 bytes; else 0);
// 4: mode 3 with the pages claimed in blocks of 4 at run time instead of equal ranges.
double measure_kv_gather_tbps(const void* k, const void* v, int64_t page_b, int64_t slot_b, int64_t head_b,
                              const int32_t* indices, int batch, int tiles, int hkv, int mode);
// A probe of a decode that reads whole pages (bench only, not an op): one 8-warp CTA per SM, equal
// contiguous ranges of the call's (request, page) pairs, each page's K and V for all 8 KV heads
// staged whole, warp = KV head, the decode's mma.sync math for 32 query heads (GQA 4), D 128, page
// 16, bf16, NHD.  mode 0: every request leaves partials that an untimed merge combines; 1: one
// launch end to end (the last piece of a split request merges it); 2: two launches timed together
// (the partials, then a merge kernel, as the decode's split merge runs).
// Returns TB/s of K+V read by the timed kernel; *max_err = max |probe - f32 reference| over the
// outputs (-1 when not compared).  0 when the call does not fit its fixed shape.
double measure_page_decode_probe_tbps(const void* k, const void* v, int64_t page_b, const int32_t* indices, int batch,
                                      int pages_per_request, int mode, double* max_err);
// Event time per launch of an empty kernel, and of a kernel whose thread 0 spins `spin_us` of
// %globaltimer (`ctas` CTAs of 128 threads in clusters of `cluster`, 1 = none, `smem_bytes`
// dynamic shared memory): the floor of a one-launch op's event time, and (minus spin_us) what a
// launch and its drain add when the kernel, not the host, sets the pace.
double measure_spin_launch_us(int ctas, int cluster, int smem_bytes, double spin_us);
// The wgmma bf16 rate (TFLOP/s) of a probe kernel that only issues m64n256k16 from shared memory
// (bench_wgmma.cu); 0 where the tool's sm_90a code is not loaded.
double measure_wgmma_tflops();
// The same rate for the prefill kernel's own wgmma shapes and mix (bench_wgmma.cu
// wgmma_mix_kernel): 1 = S (m64n128k16, shared memory), 2 = P V as 16 x m64n64k16 (P in
// registers), 3 = P V as 8 x m64n128k16, 4 = 1 then 2, 5 = 1 then 3; 0 without sm_90a code.
double measure_wgmma_mix_tflops(int mix);

}  // namespace kvattn::tools::cuda_bench
