// The op test harness: every public op of include/kvattn/ops/ x dtype x KV layout x device
// (x kernel path on CUDA) as one named, parameterised gtest case against a CPU oracle.
//
// A case is one line of the registry in op_harness.cpp (kRegistry):
//     {Op::paged_attention, {bf16}, {Kv::same}, kLayouts, {Dev::cuda}, {Path::prefill_wgmma},
//      Shape::prefill_gqa4, kCausal},
// and every combination of its lists becomes one TEST_P case whose name says all of it:
//     paged_attention/OpHarness.Run/bf16_kv_bf16_LBNHC_cuda_prefill_wgmma_prefill_gqa4_causal
// (suite prefix = op; test name = dtype, second dtype, layout, device, path, shape, options).
//
// What every case does (run_op_case):
//   * random inputs from a seed derived from the case name (a failing case replays alone);
//     permuted page tables with garbage past each row's used entries, odd lengths, NaN in the
//     null page and in the unused slots of each request's last page;
//   * every tensor of the call lives in the middle of a larger allocation whose guard bytes on
//     both sides hold a random pattern (Arena); outputs are poisoned with NaN (integer outputs
//     with a sentinel) before the call;
//   * CUDA cases mirror every allocation to the GPU, force the kernel path (ScopedKernelPath),
//     run, copy every allocation back and check that the path really ran;
//   * after the call: the guard bytes of every allocation are unchanged, every input allocation
//     is byte-identical, the oracle's result is finite where it must be, and the op's result
//     matches it within tolerance() (one table for every op, derived from the dtypes).
//
// The CPU cases are instantiated in test_ops (label unit; op_harness_test.cpp), the CUDA cases in
// test_ops_cuda (label cuda; op_harness_cuda_test.cpp), where they skip without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kvattn/core/dtype.h"

namespace kvattn::ops::harness {

// The public ops (one gtest instantiation each).
enum class Op {
  paged_attention,
  reshape_and_cache_flash,
  merge_attn_states,
  mask_empty_context_lse,
  cascade_attention,
  dcp_prefill_attention,
  copy,
  scaled_copy,
  dcp_lse_scale_pack,
  dcp_lse_combine,
  zero_kv_blocks,
  copy_page_indices,
  mamba_align_block_table,
  kvfp8_dequant,
};

enum class Dev { cpu, cuda };

// The second dtype of a case: the KV cache's (paged_attention, reshape_and_cache_flash, cascade,
// kvfp8_dequant), the output's (merge_attn_states, copy, scaled_copy, dcp_lse_combine).
// same = the case's dtype; none = the op has no second dtype.
enum class Kv { none, same, f32, f16, bf16, fp8_e4m3, fp8_e5m2, i32, i64 };

// The CUDA kernel paths of paged_attention (the dispatcher's choices); the other ops have one
// kernel each (Path::none).  On CPU the path is ignored.
enum class Path {
  none,
  automatic,      // whatever the dispatcher picks (compositions: cascade, dcp_prefill)
  decode,         // attn_kernel's split-KV decode config (plan kernel, persistent grid, merge)
  attn_prefill,   // attn_kernel's many-rows config (the fallback for what the prefill kernels lack)
  page_decode,    // page_decode.cu: whole-page decode (sm_90+)
  small_decode,   // the one-launch small-batch decode (per-CTA plan, merge by the last piece)
  streamk,        // attn_kernel's stream-K decode schedule
  prefill_mma,    // prefill_kernel.cu, mma.sync
  prefill_wgmma,  // hopper_prefill.cu, TMA + wgmma (sm_90a)
  f32,            // f32_attention.cu: float32 caches (the only path that reads them)
};

// Named shapes (sizes in op_harness.cpp kShapes).
enum class Shape {
  // CPU-sized (small: the unit build and the sanitizer build run them)
  cpu_decode,      // "decode_gqa2": 4 requests of 1 row (one with no query row), odd KV lengths
  cpu_prefill,     // "prefill_gqa3": 3 ragged requests, chunked (KV longer than the query)
  cpu_rows,        // "t13h3d24": row-wise ops, 13 tokens, 3 heads, head_dim 24
  cpu_cache,       // "p5h2d16": reshape / dequant / zero, 6 pages of 5 slots, 2 heads, head_dim 16
  // CUDA-sized (head_dim 128, 8 KV heads: the sizes the kernels are specialised for)
  decode_gqa4,     // 5 requests of 1 row, KV 1..300, GQA 4
  mtp3_gqa4,       // 4 requests of 3 rows (speculative decode), GQA 4 (12 rows per KV head)
  prefill_gqa4,    // 3 ragged chunked requests of up to 70 rows, 16 query / 4 KV heads
  gpu_rows,        // "t37h8d128": row-wise ops, 37 tokens, 8 heads, head_dim 128
  gpu_cache,       // "p16h8d128": reshape / dequant / zero, 5 pages of 16 slots, 8 heads
};

// Option bits.
enum : uint32_t {
  kCausal = 1u << 0,       // paged_attention: causal (else non-causal)
  kWin8 = 1u << 1,         // window_left = 8
  kCap30 = 1u << 2,        // logits_soft_cap = 30
  kSinks = 1u << 3,        // attention sinks
  kLnLse = 1u << 4,        // natural-log LSE (else base 2)
  kBlockTable = 1u << 5,   // pages as a vLLM block table (else FlashInfer paged indices)
  kScales = 1u << 6,       // k_scale / v_scale (and fp8 write scales) != 1, per head where possible
  kXqa = 1u << 7,          // XQA draft mask
  kPrefixLm = 1u << 8,     // PrefixLM (mm_prefix_ranges)
  kPartial = 1u << 9,      // merge: prefill_tokens_with_context < tokens; dcp: base-e LSE
  kStrided = 1u << 10,     // outputs / inputs as strided views (transposed or every other element)
  kIdx64 = 1u << 11,       // paged_attention: qo_indptr and the page ids (or block table) as int64
};

inline constexpr int kNoLayout = -1;
// 0..5: the six KVCacheLayouts (kv_cache_layout.h order: LBHNC, LBNHC, LHBNC, BLHNC, BLNHC, BHLNC)
// of a two-layer [L, B, H, N, C] backing (K and V concatenated in C), layer 1 viewed and split;
// 6, 7: separate K and V tensors in FlashInfer's NHD and HND (ops_test_util.h make_kv_cache).
inline const std::vector<int> kVllmLayouts = {0, 1, 2, 3, 4, 5};
inline const std::vector<int> kLayouts = {0, 1, 2, 3, 4, 5, 6, 7};

struct OpCase {
  Op op = Op::paged_attention;
  DType dtype = DType::f32;
  Kv kv = Kv::none;
  int layout = kNoLayout;
  Dev dev = Dev::cpu;
  Path path = Path::none;
  Shape shape = Shape::cpu_rows;
  uint32_t opts = 0;
};

// One registry line: every combination of its lists is a case.
struct Line {
  Op op;
  std::vector<DType> dtypes;
  std::vector<Kv> kvs;
  std::vector<int> layouts;
  std::vector<Dev> devs;
  std::vector<Path> paths;  // applies to CUDA; CPU cases take Path::none
  Shape shape;
  uint32_t opts = 0;
};

void PrintTo(const OpCase& c, std::ostream* os);  // gtest: the case's name

// The cases of one op on one device, in registry order (duplicates removed).
std::vector<OpCase> op_cases(Op op, Dev dev);
// "bf16_kv_fp8e4m3_LBNHC_cuda_prefill_wgmma_prefill_gqa4_causal_win8" (gtest-safe).
std::string case_name(const OpCase& c);
const char* op_name(Op op);

// The one place that says how close a result must be to the oracle (relative to max(|want|,
// rms(want)); NaN never passes): the worst of the rounding of the dtype the result is stored in
// and the precision the kernel computes in (nullopt: a conversion, one rounding).  The table is
// kTolerance in op_harness.cpp.
double tolerance(DType stored, std::optional<DType> computed = std::nullopt);

// Runs the case (gtest assertions inside); skips CUDA cases without a GPU or below the path's
// compute capability.
void run_op_case(const OpCase& c);

// Forces paged_attention's CUDA kernel path for its lifetime and puts the process's routing back
// afterwards.  The one place that knows how a path is forced.  Path::none / automatic: nothing.
class ScopedKernelPath {
 public:
  explicit ScopedKernelPath(Path p);
  ~ScopedKernelPath();
  ScopedKernelPath(const ScopedKernelPath&) = delete;
  ScopedKernelPath& operator=(const ScopedKernelPath&) = delete;

 private:
  bool active_ = false;
  int decode_opts_ = 0;
};

// Launch counters of the paths, read around a call to prove which path served it.
struct PathCounters {
  int64_t prefill = 0, hopper = 0, page = 0, small = 0, streamk = 0, f32 = 0;
  static PathCounters now();
};
// Empty when `after - before` is what `p` must produce, else what happened instead.
std::string path_mismatch(Path p, const PathCounters& before, const PathCounters& after);

class OpHarness : public ::testing::TestWithParam<OpCase> {};

struct CaseNamer {
  std::string operator()(const ::testing::TestParamInfo<OpCase>& info) const { return case_name(info.param); }
};

}  // namespace kvattn::ops::harness

// Instantiates every op's cases of one device (Dev::cpu or Dev::cuda) in this binary.
#define KVATTN_OP_HARNESS_OP(op, dev)                                                                      \
  INSTANTIATE_TEST_SUITE_P(op, OpHarness,                                                                  \
                           ::testing::ValuesIn(op_cases(::kvattn::ops::harness::Op::op, dev)), CaseNamer())
#define KVATTN_OP_HARNESS_INSTANTIATE(dev)                                   \
  TEST_P(OpHarness, Run) { run_op_case(GetParam()); }                        \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OpHarness);                  \
  KVATTN_OP_HARNESS_OP(paged_attention, dev);                                \
  KVATTN_OP_HARNESS_OP(reshape_and_cache_flash, dev);                        \
  KVATTN_OP_HARNESS_OP(merge_attn_states, dev);                              \
  KVATTN_OP_HARNESS_OP(mask_empty_context_lse, dev);                         \
  KVATTN_OP_HARNESS_OP(cascade_attention, dev);                              \
  KVATTN_OP_HARNESS_OP(dcp_prefill_attention, dev);                          \
  KVATTN_OP_HARNESS_OP(copy, dev);                                           \
  KVATTN_OP_HARNESS_OP(scaled_copy, dev);                                    \
  KVATTN_OP_HARNESS_OP(dcp_lse_scale_pack, dev);                             \
  KVATTN_OP_HARNESS_OP(dcp_lse_combine, dev);                                \
  KVATTN_OP_HARNESS_OP(zero_kv_blocks, dev);                                 \
  KVATTN_OP_HARNESS_OP(copy_page_indices, dev);                              \
  KVATTN_OP_HARNESS_OP(mamba_align_block_table, dev);                        \
  KVATTN_OP_HARNESS_OP(kvfp8_dequant, dev)
