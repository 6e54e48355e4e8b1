// The op test harness (op_harness.h): the case registry, the guarded allocations, the kernel-path
// forcing and one runner per op against its CPU oracle.
#include "op_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/error.h"
#include "kvattn/ops/ops.h"
#include "kvattn/ops/reference.h"
#include "kernel_routing.h"
#include "ops/cuda_dispatch.h"
#include "ops_test_util.h"

namespace kvattn::ops::harness {
namespace {

using ops::testing::Batch;
using ops::testing::fill_nan;
using ops::testing::fill_uniform;
using ops::testing::make_batch;

// ==== the registry ================================================================================
// One line per family of cases: every combination of its lists is a case (op_harness.h Line).
// A new kernel path: one Path value, its row in ScopedKernelPath / path_mismatch, and one line here.
const std::vector<DType> kFloat = {DType::f32, DType::f16, DType::bf16};
const std::vector<DType> kHalf = {DType::f16, DType::bf16};
const std::vector<DType> kBf16 = {DType::bf16};
const std::vector<DType> kF32 = {DType::f32};
const std::vector<DType> kIndex = {DType::i32, DType::i64};
const std::vector<Kv> kSame = {Kv::same};
const std::vector<Kv> kFp8 = {Kv::fp8_e4m3, Kv::fp8_e5m2};
const std::vector<Kv> kSameAndFp8 = {Kv::same, Kv::fp8_e4m3, Kv::fp8_e5m2};
const std::vector<Kv> kNone = {Kv::none};
const std::vector<int> kNhd = {1};  // LBNHC: the option lines run on vLLM's default layout
const std::vector<int> kAnyLayout = {kNoLayout};
const std::vector<Dev> kCpu = {Dev::cpu};
const std::vector<Dev> kCuda = {Dev::cuda};
const std::vector<Dev> kBoth = {Dev::cpu, Dev::cuda};
const std::vector<Path> kNoPath = {Path::none};
const std::vector<Path> kDecodePaths = {Path::decode, Path::small_decode, Path::streamk};
const std::vector<Path> kPrefillPaths = {Path::prefill_mma, Path::prefill_wgmma};

const std::vector<Line> kRegistry = {
    // ---- paged_attention on CPU: every dtype and layout, decode and chunked prefill -------------
    {Op::paged_attention, kFloat, kSame, kLayouts, kCpu, kNoPath, Shape::cpu_decode, kCausal},
    {Op::paged_attention, kFloat, kSame, kLayouts, kCpu, kNoPath, Shape::cpu_prefill, kCausal},
    {Op::paged_attention, kHalf, kFp8, kLayouts, kCpu, kNoPath, Shape::cpu_decode, kCausal | kScales},
    {Op::paged_attention, kHalf, kFp8, kLayouts, kCpu, kNoPath, Shape::cpu_prefill, kCausal | kScales},
    {Op::paged_attention, kFloat, kSame, kNhd, kCpu, kNoPath, Shape::cpu_prefill, kCausal | kWin8 | kCap30 | kSinks},
    {Op::paged_attention, kFloat, kSame, kNhd, kCpu, kNoPath, Shape::cpu_prefill, kBlockTable | kLnLse},
    {Op::paged_attention, kBf16, kSame, kNhd, kCpu, kNoPath, Shape::cpu_prefill, kCausal | kXqa},
    {Op::paged_attention, kBf16, kSame, kNhd, kCpu, kNoPath, Shape::cpu_prefill, kCausal | kPrefixLm | kBlockTable},
    {Op::paged_attention, kBf16, kSame, kNhd, kCpu, kNoPath, Shape::cpu_decode, kCausal | kSinks | kStrided},
    {Op::paged_attention, kBf16, kSame, kNhd, kCpu, kNoPath, Shape::cpu_decode, kCausal | kIdx64},
    {Op::paged_attention, kBf16, kSame, kNhd, kCpu, kNoPath, Shape::cpu_prefill, kCausal | kBlockTable | kIdx64},
    // ---- paged_attention on CUDA: every decode path x dtype x layout -----------------------------
    {Op::paged_attention, kHalf, kSame, kLayouts, kCuda, kDecodePaths, Shape::decode_gqa4, kCausal},
    {Op::paged_attention, kBf16, kFp8, kLayouts, kCuda, kDecodePaths, Shape::decode_gqa4, kCausal | kScales},
    {Op::paged_attention, kBf16, {Kv::same, Kv::fp8_e4m3}, kLayouts, kCuda, kDecodePaths, Shape::mtp3_gqa4, kCausal},
    {Op::paged_attention, kHalf, kSame, kLayouts, kCuda, {Path::page_decode}, Shape::decode_gqa4, kCausal},
    {Op::paged_attention, kHalf, kSame, kLayouts, kCuda, {Path::page_decode}, Shape::mtp3_gqa4, kCausal},
    {Op::paged_attention, kBf16, {Kv::fp8_e4m3}, kNhd, kCuda, kDecodePaths, Shape::decode_gqa4,
     kCausal | kScales | kSinks | kCap30 | kWin8},
    {Op::paged_attention, kBf16, kSame, kNhd, kCuda, kDecodePaths, Shape::mtp3_gqa4, kCausal | kBlockTable | kLnLse},
    {Op::paged_attention, kBf16, kSame, kNhd, kCuda, {Path::decode}, Shape::mtp3_gqa4, kCausal | kXqa},
    {Op::paged_attention, kBf16, kSame, kNhd, kCuda, {Path::decode, Path::small_decode}, Shape::decode_gqa4,
     kCausal | kStrided},
    {Op::paged_attention, kBf16, kSame, kNhd, kCuda,
     {Path::decode, Path::small_decode, Path::streamk, Path::page_decode}, Shape::decode_gqa4, kCausal | kIdx64},
    // ---- paged_attention on CUDA: every prefill path x dtype x layout ----------------------------
    {Op::paged_attention, kHalf, kSame, kLayouts, kCuda, {Path::prefill_mma}, Shape::prefill_gqa4, kCausal},
    {Op::paged_attention, kHalf, kSame, kLayouts, kCuda, {Path::prefill_wgmma}, Shape::prefill_gqa4, kCausal},
    {Op::paged_attention, kHalf, kFp8, kLayouts, kCuda, {Path::prefill_wgmma}, Shape::prefill_gqa4, kCausal | kScales},
    {Op::paged_attention, kBf16, {Kv::fp8_e4m3}, kNhd, kCuda, {Path::prefill_wgmma}, Shape::prefill_gqa4,
     kCausal | kScales | kSinks | kCap30 | kWin8},
    {Op::paged_attention, kBf16, kFp8, kLayouts, kCuda, {Path::attn_prefill}, Shape::prefill_gqa4, kCausal | kScales},
    {Op::paged_attention, kBf16, kSame, kNhd, kCuda, kPrefillPaths, Shape::prefill_gqa4, kBlockTable | kLnLse},
    {Op::paged_attention, kBf16, kSame, kNhd, kCuda, kPrefillPaths, Shape::prefill_gqa4, kCausal | kSinks},
    {Op::paged_attention, kBf16, kSame, kNhd, kCuda, kPrefillPaths, Shape::prefill_gqa4,
     kCausal | kBlockTable | kIdx64},
    {Op::paged_attention, kHalf, kSame, kNhd, kCuda, {Path::prefill_mma, Path::attn_prefill}, Shape::prefill_gqa4,
     kCausal | kWin8 | kCap30},
    {Op::paged_attention, kBf16, kSame, kNhd, kCuda, {Path::attn_prefill}, Shape::prefill_gqa4, kCausal | kXqa},
    {Op::paged_attention, kBf16, kSame, kNhd, kCuda, {Path::attn_prefill}, Shape::prefill_gqa4, kCausal | kPrefixLm},
    // ---- paged_attention on CUDA: the float32 path (float32 caches) ------------------------------
    {Op::paged_attention, kF32, kSame, kLayouts, kCuda, {Path::f32}, Shape::decode_gqa4, kCausal},
    {Op::paged_attention, kF32, kSame, kNhd, kCuda, {Path::f32}, Shape::prefill_gqa4, kCausal | kSinks | kLnLse},
    // ---- reshape_and_cache_flash ---------------------------------------------------------------------
    {Op::reshape_and_cache_flash, kFloat, kSame, kLayouts, kCpu, kNoPath, Shape::cpu_cache, 0},
    {Op::reshape_and_cache_flash, kFloat, kFp8, kLayouts, kCpu, kNoPath, Shape::cpu_cache, kScales},
    {Op::reshape_and_cache_flash, kFloat, kSameAndFp8, kLayouts, kCuda, kNoPath, Shape::gpu_cache, kScales},
    {Op::reshape_and_cache_flash, kBf16, {Kv::fp8_e4m3}, kNhd, kCpu, kNoPath, Shape::cpu_cache, kStrided},
    {Op::reshape_and_cache_flash, kBf16, {Kv::fp8_e4m3}, kNhd, kCuda, kNoPath, Shape::gpu_cache, kStrided},
    // ---- merge_attn_states / mask_empty_context_lse ------------------------------------------------
    {Op::merge_attn_states, kFloat, kSameAndFp8, kAnyLayout, kCpu, kNoPath, Shape::cpu_rows, 0},
    {Op::merge_attn_states, kFloat, kSame, kAnyLayout, kCpu, kNoPath, Shape::cpu_rows, kPartial | kStrided},
    {Op::merge_attn_states, kFloat, kSameAndFp8, kAnyLayout, kCuda, kNoPath, Shape::gpu_rows, 0},
    {Op::merge_attn_states, kFloat, kSame, kAnyLayout, kCuda, kNoPath, Shape::gpu_rows, kPartial | kStrided},
    {Op::mask_empty_context_lse, kF32, kNone, kAnyLayout, kCpu, kNoPath, Shape::cpu_rows, 0},
    {Op::mask_empty_context_lse, kF32, kNone, kAnyLayout, kCuda, kNoPath, Shape::gpu_rows, 0},
    // ---- cascade_attention / dcp_prefill_attention --------------------------------------------------
    {Op::cascade_attention, kFloat, kSame, kLayouts, kCpu, kNoPath, Shape::cpu_prefill, kCap30},
    {Op::cascade_attention, kHalf, kSame, kLayouts, kCuda, {Path::automatic}, Shape::prefill_gqa4, kCap30},
    {Op::cascade_attention, kBf16, kFp8, kNhd, kCpu, kNoPath, Shape::cpu_prefill, kScales},
    {Op::cascade_attention, kBf16, kFp8, kNhd, kCuda, {Path::automatic}, Shape::prefill_gqa4, kScales},
    {Op::dcp_prefill_attention, kFloat, kSame, kLayouts, kCpu, kNoPath, Shape::cpu_prefill, 0},
    {Op::dcp_prefill_attention, kHalf, kSame, kLayouts, kCuda, {Path::automatic}, Shape::prefill_gqa4, 0},
    // (no window: the op windows each of its passes by that pass's own query positions, which is
    // not the window of one pass over the sequence; window_left here disagrees with that oracle)
    {Op::dcp_prefill_attention, kBf16, kSame, kNhd, kCpu, kNoPath, Shape::cpu_prefill, kCap30},
    {Op::dcp_prefill_attention, kBf16, kSame, kNhd, kCuda, {Path::automatic}, Shape::prefill_gqa4, kCap30},
    // ---- copy_ / scaled_copy_ / the DCP combines ---------------------------------------------------
    {Op::copy, kFloat, {Kv::f32, Kv::f16, Kv::bf16, Kv::fp8_e4m3, Kv::fp8_e5m2}, kAnyLayout, kBoth, kNoPath,
     Shape::cpu_rows, kStrided},
    {Op::copy, {DType::fp8_e4m3, DType::fp8_e5m2}, {Kv::f32, Kv::bf16}, kAnyLayout, kBoth, kNoPath, Shape::cpu_rows, 0},
    {Op::scaled_copy, kFloat, {Kv::same, Kv::fp8_e4m3, Kv::fp8_e5m2}, kAnyLayout, kBoth, kNoPath, Shape::cpu_rows,
     kStrided},
    {Op::dcp_lse_scale_pack, kFloat, kNone, kAnyLayout, kBoth, kNoPath, Shape::cpu_rows, 0},
    {Op::dcp_lse_scale_pack, kBf16, kNone, kAnyLayout, kBoth, kNoPath, Shape::cpu_rows, kLnLse},
    {Op::dcp_lse_combine, kFloat, kSame, kAnyLayout, kBoth, kNoPath, Shape::cpu_rows, 0},
    {Op::dcp_lse_combine, kBf16, {Kv::f32}, kAnyLayout, kBoth, kNoPath, Shape::cpu_rows, kLnLse | kStrided},
    // ---- zero_kv_blocks / page_utils ---------------------------------------------------------------
    {Op::zero_kv_blocks, {DType::f32, DType::bf16}, {Kv::i32, Kv::i64}, kVllmLayouts, kBoth, kNoPath, Shape::cpu_cache, 0},
    {Op::copy_page_indices, kIndex, kNone, kAnyLayout, kBoth, kNoPath, Shape::cpu_decode, 0},
    {Op::copy_page_indices, kIndex, kNone, kAnyLayout, kBoth, kNoPath, Shape::cpu_decode, kStrided},
    {Op::mamba_align_block_table, kIndex, kNone, kAnyLayout, kBoth, kNoPath, Shape::cpu_decode, 0},
    {Op::mamba_align_block_table, kIndex, kNone, kAnyLayout, kBoth, kNoPath, Shape::cpu_decode, kStrided},
    {Op::kvfp8_dequant, kHalf, kFp8, kLayouts, kCpu, kNoPath, Shape::cpu_cache, 0},
    {Op::kvfp8_dequant, kHalf, kFp8, kLayouts, kCuda, kNoPath, Shape::gpu_cache, 0},
};

// ==== names =======================================================================================
const char* dtype_tag(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8e4m3";
    case DType::fp8_e5m2: return "fp8e5m2";
    case DType::u8: return "u8";
    case DType::i8: return "i8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

DType kv_dtype(const OpCase& c) {
  switch (c.kv) {
    case Kv::none:
    case Kv::same: return c.dtype;
    case Kv::f32: return DType::f32;
    case Kv::f16: return DType::f16;
    case Kv::bf16: return DType::bf16;
    case Kv::fp8_e4m3: return DType::fp8_e4m3;
    case Kv::fp8_e5m2: return DType::fp8_e5m2;
    case Kv::i32: return DType::i32;
    case Kv::i64: return DType::i64;
  }
  return c.dtype;
}

// What the second dtype names, per op.
const char* kv_role(Op op) {
  switch (op) {
    case Op::merge_attn_states:
    case Op::copy:
    case Op::scaled_copy:
    case Op::dcp_lse_combine: return "out";
    case Op::zero_kv_blocks: return "ids";
    default: return "kv";
  }
}

const char* path_tag(Path p) {
  switch (p) {
    case Path::none: return "";
    case Path::automatic: return "auto";
    case Path::decode: return "decode";
    case Path::attn_prefill: return "attn_prefill";
    case Path::page_decode: return "page_decode";
    case Path::small_decode: return "small_decode";
    case Path::streamk: return "streamk";
    case Path::prefill_mma: return "prefill_mma";
    case Path::prefill_wgmma: return "prefill_wgmma";
    case Path::f32: return "f32";
  }
  return "?";
}

// ==== shapes ======================================================================================
struct ShapeDef {
  const char* name;
  std::vector<int64_t> q_lens, kv_lens;  // attention: per request
  int64_t hq, hkv, dim, page;            // row-wise ops: tokens = q_lens[0], heads = hq
  int64_t num_pages = 0;                 // cache ops
};

const ShapeDef& shape_def(Shape s) {
  static const std::map<Shape, ShapeDef> kShapes = {
      {Shape::cpu_decode, {"decode_gqa2", {1, 1, 0, 1}, {17, 1, 9, 40}, 4, 2, 16, 4}},
      {Shape::cpu_prefill, {"prefill_gqa3", {7, 1, 13}, {7, 6, 29}, 6, 2, 24, 5}},
      {Shape::cpu_rows, {"t13h3d24", {13}, {}, 3, 3, 24, 0}},
      {Shape::cpu_cache, {"p5h2d16", {11}, {}, 2, 2, 16, 5, 6}},
      {Shape::decode_gqa4, {"decode_gqa4", {1, 1, 1, 1, 1}, {1, 17, 300, 64, 129}, 32, 8, 128, 16}},
      {Shape::mtp3_gqa4, {"mtp3_gqa4", {3, 3, 3, 3}, {3, 40, 157, 100}, 32, 8, 128, 16}},
      {Shape::prefill_gqa4, {"prefill_gqa4", {37, 1, 70}, {37, 50, 141}, 16, 4, 128, 16}},
      {Shape::gpu_rows, {"t37h8d128", {37}, {}, 8, 8, 128, 0}},
      {Shape::gpu_cache, {"p16h8d128", {37}, {}, 8, 8, 128, 16, 5}},
  };
  return kShapes.at(s);
}

std::string opts_tag(uint32_t o, Op op) {
  std::string s;
  auto add = [&](const char* t) { (s += '_') += t; };
  if (op == Op::paged_attention) add((o & kCausal) ? "causal" : "noncausal");
  if (o & kWin8) add("win8");
  if (o & kCap30) add("cap30");
  if (o & kSinks) add("sinks");
  if (o & kLnLse) add("lnlse");
  if (o & kBlockTable) add("blocktable");
  if (o & kScales) add("scales");
  if (o & kXqa) add("xqa");
  if (o & kPrefixLm) add("prefixlm");
  if (o & kPartial) add("partial");
  if (o & kStrided) add("strided");
  if (o & kIdx64) add("idx64");
  return s;
}

uint32_t name_seed(const std::string& name) {  // FNV-1a: the same seed on every platform
  uint32_t h = 2166136261u;
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 16777619u;
  return h;
}

// ==== guarded allocations =========================================================================
// Every tensor of a case sits in the middle of a byte block [guard | payload | guard] whose guards
// hold random bytes; CUDA cases mirror each block to the GPU and copy it back after the call.
constexpr int64_t kGuardBytes = 256;  // keeps the payload 256-byte aligned, as a fresh allocation

class Arena {
 public:
  Arena(Dev dev, std::mt19937& rng) : dev_(dev), rng_(rng) {}

  // A contiguous host tensor in a fresh guarded block (contents: the guard pattern).
  Tensor alloc(const Dims& shape, DType dt) {
    const int64_t es = dtype_size(dt);
    const int64_t payload = shape.product() * es;
    const int64_t total = 2 * kGuardBytes + (payload + 15) / 16 * 16;
    Block b;
    b.host = Tensor::empty({total}, DType::u8);
    b.payload = payload;
    auto* p = static_cast<uint8_t*>(b.host.data());
    for (int64_t i = 0; i < total; ++i) p[i] = static_cast<uint8_t>(rng_());
    Dims strides = Dims::filled(shape.size(), 1);
    for (int d = shape.size() - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
    blocks_.push_back(b);
    return b.host.view_as(dt).as_strided(shape, strides, kGuardBytes / es);
  }
  Tensor adopt(const Tensor& t) {  // a guarded copy of a CPU tensor
    if (!t.defined()) return t;
    Tensor g = alloc(t.shape(), t.dtype());
    g.copy_from(t);
    return g;
  }
  // The block of `view` may change in the call (outputs); every other block must not.
  void mark_output(const Tensor& view) { block_of(view).output = true; }

  // Snapshots every block and (CUDA) copies it to the device.  May be called again after more
  // host writes (e.g. addresses that depend on the device copy).
  void to_device() {
    for (Block& b : blocks_) {
      const auto* p = static_cast<const uint8_t*>(b.host.data());
      b.before.assign(p, p + b.host.numel());
      if (dev_ == Dev::cuda) {
        if (!b.device.defined()) b.device = Tensor::empty({b.host.numel()}, DType::u8, Device::cuda(0));
        b.device.copy_from(b.host);
      }
    }
  }
  // The same view on the device copy (the host tensor itself for CPU cases).
  Tensor dev(const Tensor& view) {
    if (!view.defined() || dev_ == Dev::cpu) return view;
    const Block& b = block_of(view);
    KVATTN_CHECK(b.device.defined(), "Arena::dev before to_device");
    return b.device.view_as(view.dtype()).as_strided(view.shape(), view.strides(),
                                                     view.byte_offset() / view.element_size());
  }
  void from_device() {
    if (dev_ != Dev::cuda) return;
    kvattn::cuda::synchronize();
    for (Block& b : blocks_) b.host.copy_from(b.device.to(Device::cpu()));
  }
  // Guards unchanged everywhere, inputs unchanged byte for byte.
  void check() const {
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const Block& b = blocks_[i];
      const auto* p = static_cast<const uint8_t*>(b.host.data());
      const int64_t n = b.host.numel();
      for (int64_t k = 0; k < n; ++k) {
        const bool guard = k < kGuardBytes || k >= kGuardBytes + b.payload;
        if ((guard || !b.output) && p[k] != b.before[static_cast<size_t>(k)]) {
          ADD_FAILURE() << "allocation " << i << (guard ? ": guard byte " : ": input byte ") << k - kGuardBytes
                        << " of a " << b.payload << "-byte payload changed (" << int(b.before[static_cast<size_t>(k)])
                        << " -> " << int(p[k]) << ")";
          break;
        }
      }
    }
  }

 private:
  struct Block {
    Tensor host, device;
    int64_t payload = 0;
    bool output = false;
    std::vector<uint8_t> before;
  };
  Block& block_of(const Tensor& view) {
    for (Block& b : blocks_)
      if (b.host.storage() == view.storage()) return b;
    throw InvalidArgument("op harness: a tensor of the call was not allocated by the Arena");
  }
  Dev dev_;
  std::mt19937& rng_;
  std::vector<Block> blocks_;
};

// The same view on another storage of the same size (a clone of the block, for the oracle).
Tensor rebase(const Tensor& view, const Tensor& base_of_clone) {
  return base_of_clone.view_as(view.dtype())
      .as_strided(view.shape(), view.strides(), view.byte_offset() / view.element_size());
}
Tensor storage_tensor(const Tensor& view) {  // the whole storage of a view, as u8
  return Tensor::from_buffer(view.storage(), 0, Dims{static_cast<int64_t>(view.storage()->size())}, Dims{1}, DType::u8);
}

// A KV cache of one of the eight layouts in a guarded block (ops_test_util.h make_kv_cache).
ops::testing::KVCache arena_kv_cache(Arena& a, int layout, int64_t pages, int64_t ps, int64_t H, int64_t D,
                                     DType dt) {
  static const int orders[6][5] = {{0, 1, 2, 3, 4}, {0, 1, 3, 2, 4}, {0, 2, 1, 3, 4},
                                   {1, 0, 2, 3, 4}, {1, 0, 3, 2, 4}, {1, 2, 0, 3, 4}};
  ops::testing::KVCache c;
  if (layout == 6 || layout == 7) {  // separate K and V tensors, NHD or HND (viewed as NHD)
    c.backing = layout == 6 ? a.alloc({2, pages, ps, H, D}, dt) : a.alloc({2, pages, H, ps, D}, dt);
    c.k = layout == 6 ? c.backing.select(0, 0) : c.backing.select(0, 0).transpose(1, 2);
    c.v = layout == 6 ? c.backing.select(0, 1) : c.backing.select(0, 1).transpose(1, 2);
    return c;
  }
  const int64_t logical[5] = {2, pages, H, ps, 2 * D};
  Dims phys;
  for (int i = 0; i < 5; ++i) phys.push_back(logical[orders[layout][i]]);
  c.backing = a.alloc(phys, dt);
  Dims inv = Dims::filled(5, 0);
  for (int i = 0; i < 5; ++i) inv[orders[layout][i]] = i;
  std::tie(c.k, c.v) = split_kv_cache_layer_view(c.backing.permute(inv).select(0, 1), D);
  return c;
}

// ==== comparisons =================================================================================
struct TolRow {
  DType dt;
  double store;    // rounding of a result stored in this dtype (about one unit in the last place)
  double compute;  // error of a kernel computing in this dtype (P, V and partial sums)
};
constexpr TolRow kTolerance[] = {
    {DType::f32, 1e-5, 1e-4},   {DType::f16, 1e-3, 1.5e-2},    {DType::bf16, 8e-3, 3e-2},
    {DType::fp8_e4m3, 0.13, 1.5e-2}, {DType::fp8_e5m2, 0.26, 1.5e-2},
};
const TolRow& tol_row(DType t) {
  for (const TolRow& r : kTolerance)
    if (r.dt == t) return r;
  return kTolerance[0];
}

// The result rows must be finite (out) or not NaN (LSE, where -inf means "saw no key").
void expect_oracle_finite(const Tensor& t, bool allow_inf, const char* what) {
  const std::vector<double> v = t.to_double_vector();
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isnan(v[i]) || (!allow_inf && std::isinf(v[i]))) {
      ADD_FAILURE() << "the oracle's " << what << " element " << i << " is " << v[i] << " (inputs not finite?)";
      return;
    }
}

// got against want: NaN nowhere (rel_error makes it infinite), relative error within tol.
void expect_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  const double e = ops::testing::rel_error(got, want);
  EXPECT_LE(e, tol) << what << ": max relative error " << e << " (tolerance " << tol << ")";
}
// Every element still NaN (not written).
void expect_all_nan(const Tensor& t, const char* what) {
  const std::vector<double> v = t.to_double_vector();
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isnan(v[i])) {
      ADD_FAILURE() << what << " element " << i << " was written (" << v[i] << ") but must stay untouched";
      return;
    }
}
// Position by position: both NaN (untouched poison), or close.
void expect_close_nan_equal(const Tensor& got, const Tensor& want, double tol, const char* what) {
  const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  double ss = 0;
  for (double x : w) ss += std::isfinite(x) ? x * x : 0;
  const double rms = w.empty() ? 0 : std::sqrt(ss / static_cast<double>(w.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) != std::isnan(g[i])) {
      ADD_FAILURE() << what << " element " << i << ": " << g[i] << ", want " << w[i];
      return;
    }
    if (std::isnan(w[i])) continue;
    if (std::isinf(w[i]) || std::isinf(g[i])) {
      if (g[i] != w[i]) ADD_FAILURE() << what << " element " << i << ": " << g[i] << ", want " << w[i];
      if (g[i] != w[i]) return;
      continue;
    }
    const double err = std::abs(g[i] - w[i]) / std::max({std::abs(w[i]), rms, 1e-30});
    if (err > tol) {
      ADD_FAILURE() << what << " element " << i << ": " << g[i] << ", want " << w[i] << " (relative error " << err
                    << ", tolerance " << tol << ")";
      return;
    }
  }
}
// LSEs: infinities equal, finite ones within an absolute tolerance.
void expect_lse_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  for (size_t i = 0; i < g.size(); ++i) {
    const bool ok = std::isinf(w[i]) || std::isinf(g[i]) ? g[i] == w[i] : std::abs(g[i] - w[i]) <= tol;
    if (!ok) {
      ADD_FAILURE() << what << " element " << i << ": " << g[i] << ", want " << w[i] << " (tolerance " << tol << ")";
      return;
    }
  }
}

void fill_int(const Tensor& t, int64_t v) {
  for (int64_t i = 0; i < t.numel(); ++i)
    store_from_double(static_cast<char*>(t.data()) + i * t.element_size(), t.dtype(), static_cast<double>(v));
}
constexpr int64_t kIntPoison = -7777;

// ==== one case's context ==========================================================================
struct Ctx {
  const OpCase& c;
  const ShapeDef& s;
  std::mt19937 rng;
  Arena arena;
  Ctx(const OpCase& oc, uint32_t seed) : c(oc), s(shape_def(oc.shape)), rng(seed), arena(oc.dev, rng) {}
};

// Runs the op under its kernel path and checks the path; then copies back and checks the guards.
void call(Ctx& x, const std::function<void()>& op) {
  {
    ScopedKernelPath path(x.c.dev == Dev::cuda ? x.c.path : Path::none);
    const PathCounters before = PathCounters::now();
    op();
    if (x.c.dev == Dev::cuda) kvattn::cuda::synchronize();
    const std::string why = x.c.dev == Dev::cuda ? path_mismatch(x.c.path, before, PathCounters::now()) : "";
    EXPECT_TRUE(why.empty()) << "kernel path " << path_tag(x.c.path) << " did not serve the call: " << why;
  }
  x.arena.from_device();
  x.arena.check();
}

// ==== paged_attention =============================================================================
void run_paged_attention(Ctx& x) {
  const OpCase& c = x.c;
  const ShapeDef& s = x.s;
  const DType q_dt = c.dtype, kv_dt = kv_dtype(c), out_dt = c.dtype;
  Batch b = make_batch(s.q_lens, s.kv_lens, s.page, x.rng, /*pad_rows=*/2);
  const ops::testing::KVCache cache = arena_kv_cache(x.arena, c.layout, b.num_pages, s.page, s.hkv, s.dim, kv_dt);
  fill_uniform(cache.backing, x.rng);
  fill_nan(cache.k.select(0, 0));  // page 0 is never referenced
  fill_nan(cache.v.select(0, 0));
  for (size_t r = 0; r < s.kv_lens.size(); ++r) {  // slots past kv_len of each last page: NaN
    const int64_t used = s.kv_lens[r] % s.page;
    if (s.kv_lens[r] == 0 || used == 0) continue;
    const int64_t pg = b.indices.at<int32_t>({b.indptr.at<int32_t>({static_cast<int64_t>(r) + 1}) - 1});
    for (int64_t slot = used; slot < s.page; ++slot) {
      fill_nan(cache.k.select(0, pg).select(0, slot));
      fill_nan(cache.v.select(0, pg).select(0, slot));
    }
  }
  const int64_t T = b.num_tokens;
  const bool strided = (c.opts & kStrided) != 0;
  // kStrided: query and output as [T, H, D] views of [H, T, D] allocations
  auto act = [&](DType dt) {
    return strided ? x.arena.alloc({s.hq, T, s.dim}, dt).transpose(0, 1) : x.arena.alloc({T, s.hq, s.dim}, dt);
  };
  Tensor q = act(q_dt);
  fill_uniform(q, x.rng, -2, 2);
  Tensor out = act(out_dt);
  fill_nan(out);
  x.arena.mark_output(out);
  Tensor lse = x.arena.alloc({T, s.hq}, DType::f32);
  fill_nan(lse);
  x.arena.mark_output(lse);

  PagedAttentionArgs a;
  a.query = q;
  a.k_cache = cache.k;
  a.v_cache = cache.v;
  auto wide = [&](const Tensor& t) { return x.arena.adopt((c.opts & kIdx64) ? t.to(DType::i64) : t); };
  a.qo_indptr = wide(b.qo_indptr);
  if (c.opts & kBlockTable) {
    a.block_table = wide(b.block_table);
    a.seq_lens = x.arena.adopt(b.seq_lens);
  } else {
    a.paged_kv_indptr = x.arena.adopt(b.indptr);
    a.paged_kv_indices = wide(b.indices);
    a.paged_kv_last_page_len = x.arena.adopt(b.last_page_len);
  }
  a.out = out;
  a.lse = lse;
  a.lse_base = (c.opts & kLnLse) ? LseBase::E : LseBase::Two;
  a.causal = (c.opts & kCausal) != 0;
  if (c.opts & kWin8) a.window_left = 8;
  if (c.opts & kCap30) a.logits_soft_cap = 30.0;
  if (c.opts & kScales) {
    a.k_scale = 0.75;
    a.v_scale = 1.25;
  }
  a.max_query_len = *std::max_element(s.q_lens.begin(), s.q_lens.end());
  if (c.opts & kSinks) {
    a.sinks = x.arena.alloc({s.hq}, DType::f32);
    fill_uniform(a.sinks, x.rng, -1, 3);
  }
  if (c.opts & kPrefixLm) {  // tokens 1..3 of every request of >= 4 rows form an image span
    a.mm_prefix_ranges = x.arena.alloc({T, 2}, DType::i32);
    fill_int(a.mm_prefix_ranges, -1);
    int64_t row = 0;
    for (size_t r = 0; r < s.q_lens.size(); ++r)
      for (int64_t t = 0; t < s.q_lens[r]; ++t, ++row)
        if (s.q_lens[r] >= 4 && t >= 1 && t < 4) {
          const int64_t ctx = s.kv_lens[r] - s.q_lens[r];
          a.mm_prefix_ranges.at<int32_t>({row, 0}) = static_cast<int32_t>(ctx + 1);
          a.mm_prefix_ranges.at<int32_t>({row, 1}) = static_cast<int32_t>(ctx + 3);
        }
  }
  if (c.opts & kXqa) {  // the causal draft mask with some bits below the diagonal cleared
    const Tensor m = make_xqa_draft_block_mask(s.q_lens, true);
    a.xqa_draft_mask = x.arena.alloc({T, m.size(1)}, DType::i32);
    fill_int(a.xqa_draft_mask, 0);
    for (int64_t i = 0; i < m.size(0); ++i)
      for (int64_t w = 0; w < m.size(1); ++w) {
        uint32_t bits = static_cast<uint32_t>(m.at<int32_t>({i, w}));
        if (x.rng() % 2) bits &= ~(1u << (x.rng() % 3));
        a.xqa_draft_mask.at<int32_t>({i, w}) = static_cast<int32_t>(bits);
      }
  }

  // the oracle, into outputs of its own
  PagedAttentionArgs r = a;
  r.out = Tensor::empty({T, s.hq, s.dim}, out_dt);
  r.lse = Tensor::empty({T, s.hq}, DType::f32);
  fill_nan(r.out);
  fill_nan(r.lse);
  reference::paged_attention(r);
  const int64_t used = b.qo_indptr.to_vector<int32_t>().back();
  expect_oracle_finite(r.out.slice(0, 0, used), false, "output");
  expect_oracle_finite(r.lse.slice(0, 0, used), true, "LSE");

  x.arena.to_device();
  PagedAttentionArgs g = a;
  for (Tensor* t : {&g.query, &g.k_cache, &g.v_cache, &g.qo_indptr, &g.paged_kv_indptr, &g.paged_kv_indices,
                    &g.paged_kv_last_page_len, &g.block_table, &g.seq_lens, &g.out, &g.lse, &g.sinks,
                    &g.mm_prefix_ranges, &g.xqa_draft_mask})
    *t = x.arena.dev(*t);
  call(x, [&] { paged_attention(g); });

  const double tol = std::max(tolerance(out_dt, q_dt), tolerance(out_dt, kv_dt));
  expect_close(out.slice(0, 0, used), r.out.slice(0, 0, used), tol, "output");
  expect_all_nan(out.slice(0, used, T), "padding row output");
  expect_lse_close(lse.slice(0, 0, used), r.lse.slice(0, 0, used), std::max(tol, 1e-3), "LSE");
  expect_all_nan(lse.slice(0, used, T), "padding row LSE");
}

// ==== reshape_and_cache_flash =====================================================================
void run_reshape_and_cache(Ctx& x) {
  const OpCase& c = x.c;
  const ShapeDef& s = x.s;
  const DType kv_dt = kv_dtype(c);
  const int64_t T = s.q_lens[0], H = s.hkv, D = s.dim, nb = s.num_pages;
  const ops::testing::KVCache cache = arena_kv_cache(x.arena, c.layout, nb, s.page, H, D, kv_dt);
  fill_nan(cache.backing);
  x.arena.mark_output(cache.backing);
  // kStrided: key / value as every other row of a wider allocation
  auto act = [&] {
    if (c.opts & kStrided) return x.arena.alloc({T + 2, H, 2 * D}, c.dtype).slice(2, 0, 2 * D, 2);
    return x.arena.alloc({T + 2, H, D}, c.dtype);  // 2 rows past the slot mapping (not read)
  };
  Tensor key = act(), value = act();
  fill_uniform(key, x.rng, -3, 3);
  fill_uniform(value, x.rng, -3, 3);
  std::vector<int64_t> slots(static_cast<size_t>(nb * s.page));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), x.rng);
  slots.resize(static_cast<size_t>(T));
  slots[1] = -1;  // skipped tokens
  slots[static_cast<size_t>(T) - 2] = -1;
  ReshapeAndCacheArgs a;
  a.key = key;
  a.value = value;
  a.key_cache = cache.k;
  a.value_cache = cache.v;
  a.slot_mapping = x.arena.adopt(Tensor::from_vector(slots));
  if (c.kv != Kv::same) {
    a.kv_cache_dtype = kv_dt == DType::fp8_e4m3 ? KVCacheDType::Fp8E4M3 : KVCacheDType::Fp8E5M2;
    const int64_t n = (c.opts & kScales) ? H : 1;  // powers of two: the division is exact
    a.k_scale = x.arena.alloc({n}, DType::f32);
    a.v_scale = x.arena.alloc({n}, DType::f32);
    for (int64_t h = 0; h < n; ++h) {
      a.k_scale.at<float>({h}) = std::ldexp(1.0f, static_cast<int>(h % 3) - 1);
      a.v_scale.at<float>({h}) = std::ldexp(1.0f, 1 - static_cast<int>(h % 3));
    }
  }
  const Tensor ref_base = storage_tensor(cache.backing).clone();
  ReshapeAndCacheArgs r = a;
  r.key_cache = rebase(cache.k, ref_base);
  r.value_cache = rebase(cache.v, ref_base);
  reference::reshape_and_cache_flash(r);
  for (int64_t t = 0; t < T; ++t)
    if (slots[static_cast<size_t>(t)] >= 0) {
      const int64_t sl = slots[static_cast<size_t>(t)];
      expect_oracle_finite(r.key_cache.select(0, sl / s.page).select(0, sl % s.page), false, "key slot");
      expect_oracle_finite(r.value_cache.select(0, sl / s.page).select(0, sl % s.page), false, "value slot");
    }

  x.arena.to_device();
  ReshapeAndCacheArgs g = a;
  for (Tensor* t : {&g.key, &g.value, &g.key_cache, &g.value_cache, &g.slot_mapping, &g.k_scale, &g.v_scale})
    *t = x.arena.dev(*t);
  call(x, [&] { reshape_and_cache_flash(g); });
  // the whole backing (both layers, every slot): written slots close, the rest still NaN
  expect_close_nan_equal(cache.backing, rebase(cache.backing, ref_base), tolerance(kv_dt), "cache");
}

// ==== merge_attn_states / mask_empty_context_lse ==================================================
void run_merge(Ctx& x) {
  const OpCase& c = x.c;
  const int64_t T = x.s.q_lens[0], H = x.s.hq, D = x.s.dim;
  const DType out_dt = kv_dtype(c);
  const bool strided = (c.opts & kStrided) != 0;
  auto rows = [&](DType dt) {
    return strided ? x.arena.alloc({H, T, D}, dt).transpose(0, 1) : x.arena.alloc({T, H, D}, dt);
  };
  auto lses = [&] {  // [H, T]; strided: a transposed [T, H]
    return strided ? x.arena.alloc({T, H}, DType::f32).transpose(0, 1) : x.arena.alloc({H, T}, DType::f32);
  };
  MergeAttnStatesArgs a;
  a.output = rows(out_dt);
  a.prefix_output = rows(c.dtype);
  a.suffix_output = rows(c.dtype);
  a.prefix_lse = lses();
  a.suffix_lse = lses();
  a.output_lse = lses();
  fill_uniform(a.prefix_output, x.rng);
  fill_uniform(a.suffix_output, x.rng);
  fill_uniform(a.prefix_lse, x.rng, -3, 3);
  fill_uniform(a.suffix_lse, x.rng, -3, 3);
  // the infinity conventions: an empty prefix (-inf), FA2's +inf, both empty
  a.prefix_lse.set({0, 1}, -INFINITY);
  a.suffix_lse.set({H - 1, 2}, INFINITY);
  a.prefix_lse.set({0, 3}, -INFINITY);
  a.suffix_lse.set({0, 3}, -INFINITY);
  fill_nan(a.output);
  fill_nan(a.output_lse);
  x.arena.mark_output(a.output);
  x.arena.mark_output(a.output_lse);
  if (c.opts & kPartial) a.prefill_tokens_with_context = T - 3;
  if (out_dt == DType::fp8_e4m3 || out_dt == DType::fp8_e5m2) {
    a.output_scale = x.arena.alloc({1}, DType::f32);
    a.output_scale.at<float>({0}) = 0.5f;
  }
  MergeAttnStatesArgs r = a;
  r.output = Tensor::empty({T, H, D}, out_dt);
  r.output_lse = Tensor::empty({H, T}, DType::f32);
  fill_nan(r.output);
  fill_nan(r.output_lse);
  reference::merge_attn_states(r);
  expect_oracle_finite(r.output, false, "output");
  expect_oracle_finite(r.output_lse, true, "LSE");

  x.arena.to_device();
  MergeAttnStatesArgs g = a;
  for (Tensor* t : {&g.output, &g.prefix_output, &g.prefix_lse, &g.suffix_output, &g.suffix_lse, &g.output_lse,
                    &g.output_scale})
    *t = x.arena.dev(*t);
  call(x, [&] { merge_attn_states(g); });
  expect_close(a.output, r.output, tolerance(out_dt), "output");
  expect_lse_close(a.output_lse, r.output_lse, 1e-4, "LSE");
}

void run_mask_empty_context_lse(Ctx& x) {
  const int64_t T = x.s.q_lens[0], H = x.s.hq;
  const Tensor lse = x.arena.alloc({H, T}, DType::f32);
  fill_uniform(lse, x.rng, -3, 3);
  x.arena.mark_output(lse);
  // 4 requests over T tokens; the second and the last have an empty context chunk
  const std::vector<int32_t> qsl = {0, 2, static_cast<int32_t>(T / 2), static_cast<int32_t>(T - 1),
                                    static_cast<int32_t>(T - 1)};
  const std::vector<int32_t> csl = {0, 4, 4, 9, 9};
  const Tensor q = x.arena.adopt(Tensor::from_vector(qsl)), cs = x.arena.adopt(Tensor::from_vector(csl));
  Tensor want = lse.clone();
  for (size_t r = 0; r + 1 < qsl.size(); ++r)
    if (csl[r] == csl[r + 1])
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = qsl[r]; t < qsl[r + 1]; ++t) want.set({h, t}, -INFINITY);
  x.arena.to_device();
  call(x, [&] { mask_empty_context_lse(x.arena.dev(lse), x.arena.dev(q), x.arena.dev(cs)); });
  expect_lse_close(lse, want, 0.0, "LSE");
}

// ==== cascade_attention / dcp_prefill_attention ===================================================
// Both equal one causal paged_attention over the whole sequence (the oracle).
void run_cascade(Ctx& x) {
  const OpCase& c = x.c;
  const ShapeDef& s = x.s;
  const DType kv_dt = kv_dtype(c);
  const int64_t ps = s.page, shared_pages = 2, B = static_cast<int64_t>(s.q_lens.size());
  std::vector<int32_t> qo{0}, full_bt, ip{0}, idx, last, sl, shared;
  int32_t next_page = 1 + static_cast<int32_t>(shared_pages);
  for (int32_t i = 0; i < shared_pages; ++i) shared.push_back(1 + i);
  std::vector<std::vector<int32_t>> rows;
  int64_t width = 0;
  for (int64_t r = 0; r < B; ++r) {  // suffix = each request's KV length (>= its query rows)
    qo.push_back(qo.back() + static_cast<int32_t>(s.q_lens[r]));
    const int64_t suffix = s.kv_lens[r], n = (suffix + ps - 1) / ps;
    std::vector<int32_t> row(shared);
    for (int64_t i = 0; i < n; ++i) {
      row.push_back(next_page);
      idx.push_back(next_page++);
    }
    width = std::max<int64_t>(width, static_cast<int64_t>(row.size()) + 1);
    rows.push_back(row);
    ip.push_back(ip.back() + static_cast<int32_t>(n));
    last.push_back(static_cast<int32_t>(n == 0 ? 0 : suffix - (n - 1) * ps));
    sl.push_back(static_cast<int32_t>(shared_pages * ps + suffix));
  }
  for (auto& row : rows) {
    row.resize(static_cast<size_t>(width), 1 << 30);  // garbage past the used entries
    full_bt.insert(full_bt.end(), row.begin(), row.end());
  }
  // permute the page ids (the cache is filled at random: only the mapping matters)
  std::vector<int32_t> perm(static_cast<size_t>(next_page));
  std::iota(perm.begin() + 1, perm.end(), 1);
  std::shuffle(perm.begin() + 1, perm.end(), x.rng);
  for (auto* v : {&full_bt, &idx, &shared})
    for (int32_t& p : *v)
      if (p < next_page) p = perm[static_cast<size_t>(p)];
  const int64_t T = qo.back();
  const ops::testing::KVCache cache = arena_kv_cache(x.arena, c.layout, next_page + 1, ps, s.hkv, s.dim, kv_dt);
  fill_uniform(cache.backing, x.rng);
  fill_nan(cache.k.select(0, 0));
  fill_nan(cache.v.select(0, 0));
  CascadeAttentionArgs a;
  a.query = x.arena.alloc({T, s.hq, s.dim}, c.dtype);
  fill_uniform(a.query, x.rng, -2, 2);
  a.k_cache = cache.k;
  a.v_cache = cache.v;
  a.qo_indptr = x.arena.adopt(Tensor::from_vector(qo));
  a.shared_kv_page_indices = x.arena.adopt(Tensor::from_vector(shared));
  a.paged_kv_indptr = x.arena.adopt(Tensor::from_vector(ip));
  a.paged_kv_indices = x.arena.adopt(Tensor::from_vector(idx));
  a.paged_kv_last_page_len = x.arena.adopt(Tensor::from_vector(last));
  a.out = x.arena.alloc({T, s.hq, s.dim}, c.dtype);
  fill_nan(a.out);
  x.arena.mark_output(a.out);
  if (c.opts & kCap30) a.logits_soft_cap = 30.0;
  if (c.opts & kScales) a.k_scale = 0.75, a.v_scale = 1.25;

  PagedAttentionArgs full;
  full.query = a.query;
  full.k_cache = cache.k;
  full.v_cache = cache.v;
  full.qo_indptr = a.qo_indptr;
  full.block_table = Tensor::from_vector(full_bt, Dims{B, width});
  full.seq_lens = Tensor::from_vector(sl);
  full.out = Tensor::empty({T, s.hq, s.dim}, c.dtype);
  fill_nan(full.out);
  full.logits_soft_cap = a.logits_soft_cap;
  full.k_scale = a.k_scale;
  full.v_scale = a.v_scale;
  reference::paged_attention(full);
  expect_oracle_finite(full.out, false, "output");

  x.arena.to_device();
  CascadeAttentionArgs g = a;
  for (Tensor* t : {&g.query, &g.k_cache, &g.v_cache, &g.qo_indptr, &g.shared_kv_page_indices, &g.paged_kv_indptr,
                    &g.paged_kv_indices, &g.paged_kv_last_page_len, &g.out})
    *t = x.arena.dev(*t);
  call(x, [&] { cascade_attention(g); });
  const double tol = std::max(tolerance(c.dtype, c.dtype), tolerance(c.dtype, kv_dt));
  expect_close(a.out, full.out, tol, "output");
}

void run_dcp_prefill(Ctx& x) {
  const OpCase& c = x.c;
  const ShapeDef& s = x.s;
  const int64_t ps = s.page, B = static_cast<int64_t>(s.q_lens.size());
  Batch full = make_batch(s.q_lens, s.kv_lens, ps, x.rng);
  const int64_t T = full.num_tokens;
  const ops::testing::KVCache cache = arena_kv_cache(x.arena, c.layout, full.num_pages, ps, s.hkv, s.dim, c.dtype);
  fill_uniform(cache.backing, x.rng);
  fill_nan(cache.k.select(0, 0));
  fill_nan(cache.v.select(0, 0));
  DcpPrefillArgs a;
  a.query = x.arena.alloc({T, s.hq, s.dim}, c.dtype);
  a.key = x.arena.alloc({T, s.hkv, s.dim}, c.dtype);
  a.value = x.arena.alloc({T, s.hkv, s.dim}, c.dtype);
  for (const Tensor* t : {&a.query, &a.key, &a.value}) fill_uniform(*t, x.rng, -2, 2);
  // the new tokens' slots hold NaN in the op's cache (the context pass must not read them); the
  // oracle's cache receives the new tokens there
  std::vector<int64_t> slots;
  std::vector<int32_t> ctx_ip{0}, ctx_idx, ctx_last;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t ctx = s.kv_lens[r] - s.q_lens[r];
    for (int64_t i = 0; i < s.q_lens[r]; ++i) {
      const int64_t pos = ctx + i;
      const int64_t pg = full.block_table.at<int32_t>({r, pos / ps});
      slots.push_back(pg * ps + pos % ps);
      fill_nan(cache.k.select(0, pg).select(0, pos % ps));
      fill_nan(cache.v.select(0, pg).select(0, pos % ps));
    }
    const int64_t n = (ctx + ps - 1) / ps;
    for (int64_t i = 0; i < n; ++i) ctx_idx.push_back(full.block_table.at<int32_t>({r, i}));
    ctx_ip.push_back(ctx_ip.back() + static_cast<int32_t>(n));
    ctx_last.push_back(static_cast<int32_t>(n == 0 ? 0 : ctx - (n - 1) * ps));
  }
  a.k_cache = cache.k;
  a.v_cache = cache.v;
  a.qo_indptr = x.arena.adopt(full.qo_indptr);
  a.paged_kv_indptr = x.arena.adopt(Tensor::from_vector(ctx_ip));
  a.paged_kv_indices = ctx_idx.empty() ? x.arena.alloc({0}, DType::i32) : x.arena.adopt(Tensor::from_vector(ctx_idx));
  a.paged_kv_last_page_len = x.arena.adopt(Tensor::from_vector(ctx_last));
  a.out = x.arena.alloc({T, s.hq, s.dim}, c.dtype);
  fill_nan(a.out);
  x.arena.mark_output(a.out);
  if (c.opts & kWin8) a.window_left = 8;
  if (c.opts & kCap30) a.logits_soft_cap = 30.0;

  const Tensor ref_base = storage_tensor(cache.backing).clone();
  const Tensor rk = rebase(cache.k, ref_base), rv = rebase(cache.v, ref_base);
  ReshapeAndCacheArgs w;
  w.key = a.key;
  w.value = a.value;
  w.key_cache = rk;
  w.value_cache = rv;
  w.slot_mapping = Tensor::from_vector(slots);
  reference::reshape_and_cache_flash(w);
  PagedAttentionArgs one;
  one.query = a.query;
  one.k_cache = rk;
  one.v_cache = rv;
  one.qo_indptr = full.qo_indptr;
  one.block_table = full.block_table;
  one.seq_lens = full.seq_lens;
  one.window_left = a.window_left;
  one.logits_soft_cap = a.logits_soft_cap;
  one.out = Tensor::empty({T, s.hq, s.dim}, c.dtype);
  fill_nan(one.out);
  reference::paged_attention(one);
  expect_oracle_finite(one.out, false, "output");

  x.arena.to_device();
  DcpPrefillArgs g = a;
  for (Tensor* t : {&g.query, &g.k_cache, &g.v_cache, &g.qo_indptr, &g.paged_kv_indptr, &g.paged_kv_indices,
                    &g.paged_kv_last_page_len, &g.key, &g.value, &g.out})
    *t = x.arena.dev(*t);
  call(x, [&] { dcp_prefill_attention(g); });
  expect_close(a.out, one.out, tolerance(c.dtype, c.dtype), "output");
}

// ==== copy_ / scaled_copy_ / the DCP combines =====================================================
void run_copy(Ctx& x) {
  const OpCase& c = x.c;
  const int64_t T = x.s.q_lens[0], H = x.s.hq, D = x.s.dim;
  const DType dst_dt = kv_dtype(c);
  const bool scaled = c.op == Op::scaled_copy, strided = (c.opts & kStrided) != 0;
  // kStrided: src = every other element of the last dimension, dst = a transposed allocation
  const Tensor src = strided ? x.arena.alloc({T, H, 2 * D}, c.dtype).slice(2, 0, 2 * D, 2)
                             : x.arena.alloc({T, H, D}, c.dtype);
  const Tensor dst = strided ? x.arena.alloc({H, T, D}, dst_dt).transpose(0, 1) : x.arena.alloc({T, H, D}, dst_dt);
  fill_uniform(src, x.rng, -2, 2);
  fill_nan(dst);
  x.arena.mark_output(dst);
  const float scale = 0.375f;
  Tensor want = Tensor::empty({T, H, D}, dst_dt);  // the oracle: one rounding from float
  const std::vector<double> v = src.to_double_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    const float f = scaled ? static_cast<float>(v[i]) * scale : static_cast<float>(v[i]);
    store_from_double(static_cast<char*>(want.data()) + static_cast<int64_t>(i) * want.element_size(), dst_dt, f);
  }
  expect_oracle_finite(want, false, "result");
  x.arena.to_device();
  call(x, [&] {
    if (scaled) scaled_copy_(x.arena.dev(dst), x.arena.dev(src), scale);
    else copy_(x.arena.dev(dst), x.arena.dev(src));
  });
  expect_close(dst, want, tolerance(dst_dt), "result");
}

// The weights of W ranks' LSEs at one row (dcp_combine.h): exp(lse_r - g), 0 for bad ones.
std::vector<double> dcp_weights(const std::vector<double>& lse, bool base_e, double* g_out) {
  auto ex = [&](double v) { return base_e ? std::exp(v) : std::exp2(v); };
  auto lg = [&](double v) { return base_e ? std::log(v) : std::log2(v); };
  double m = -INFINITY;
  for (double l : lse)
    if (std::isfinite(l)) m = std::max(m, l);
  std::vector<double> w(lse.size(), 0.0);
  if (m == -INFINITY) {
    *g_out = -INFINITY;
    return w;
  }
  double sum = 0;
  for (double l : lse)
    if (std::isfinite(l)) sum += ex(l - m);
  const double g = m + lg(sum);
  for (size_t r = 0; r < lse.size(); ++r)
    if (std::isfinite(lse[r])) w[r] = ex(lse[r] - g);
  *g_out = g;
  return w;
}

// LSEs with the bad cases of dcp_combine.h: a rank that saw nothing, FA2's +inf, NaN, all bad.
void fill_dcp_lses(Tensor lse /* [W, T, X] */, std::mt19937& rng) {
  fill_uniform(lse, rng, -4, 4);
  const int64_t W = lse.size(0), X = lse.size(2);
  lse.set({W - 1, 1, 0}, -INFINITY);
  for (int64_t r = 0; r < W; ++r) lse.set({r, 2, X - 1}, -INFINITY);
  lse.set({0, 3, 0}, INFINITY);
  lse.set({1, 3, 0}, NAN);
}

void run_dcp_scale_pack(Ctx& x) {
  const OpCase& c = x.c;
  const int64_t W = 3, T = x.s.q_lens[0], H = 2, D = x.s.dim, rank = 1;
  const bool base_e = (c.opts & kLnLse) != 0;
  const Tensor partial = x.arena.alloc({T, W * H, D}, c.dtype), all_lse = x.arena.alloc({W, T, W * H}, DType::f32);
  const Tensor packed = x.arena.alloc({W, T, H, D}, DType::f32), global = x.arena.alloc({T, W * H}, DType::f32);
  fill_uniform(partial, x.rng, -2, 2);
  fill_dcp_lses(all_lse, x.rng);
  fill_nan(packed);
  fill_nan(global);
  x.arena.mark_output(packed);
  x.arena.mark_output(global);
  Tensor want = Tensor::empty({W, T, H, D}, DType::f32), want_g = Tensor::empty({T, W * H}, DType::f32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hw = 0; hw < W * H; ++hw) {
      std::vector<double> l;
      for (int64_t r = 0; r < W; ++r) l.push_back(all_lse.get({r, t, hw}));
      double g = 0;
      const std::vector<double> w = dcp_weights(l, base_e, &g);
      want_g.set({t, hw}, g);
      for (int64_t d = 0; d < D; ++d) want.set({hw / H, t, hw % H, d}, w[rank] * partial.get({t, hw, d}));
    }
  expect_oracle_finite(want, false, "packed");
  x.arena.to_device();
  call(x, [&] {
    dcp_lse_scale_pack(x.arena.dev(partial), x.arena.dev(all_lse), rank, base_e, x.arena.dev(packed),
                       x.arena.dev(global));
  });
  expect_close(packed, want, tolerance(DType::f32, DType::f32), "packed");
  expect_lse_close(global, want_g, 1e-4, "global LSE");
}

void run_dcp_combine(Ctx& x) {
  const OpCase& c = x.c;
  const int64_t W = 4, T = x.s.q_lens[0], H = x.s.hq, D = x.s.dim;
  const DType out_dt = kv_dtype(c);
  const bool base_e = (c.opts & kLnLse) != 0;
  const Tensor partials = (c.opts & kStrided) ? x.arena.alloc({W, T, H, 2 * D}, c.dtype).slice(3, 0, 2 * D, 2)
                                              : x.arena.alloc({W, T, H, D}, c.dtype);
  const Tensor lses = x.arena.alloc({W, T, H}, DType::f32);
  const Tensor out = (c.opts & kStrided) ? x.arena.alloc({H, T, D}, out_dt).transpose(0, 1)
                                         : x.arena.alloc({T, H, D}, out_dt);
  const Tensor global = x.arena.alloc({T, H}, DType::f32);
  fill_uniform(partials, x.rng, -2, 2);
  fill_dcp_lses(lses, x.rng);
  fill_nan(out);
  fill_nan(global);
  x.arena.mark_output(out);
  x.arena.mark_output(global);
  Tensor want = Tensor::empty({T, H, D}, DType::f32), want_g = Tensor::empty({T, H}, DType::f32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> l;
      for (int64_t r = 0; r < W; ++r) l.push_back(lses.get({r, t, h}));
      double g = 0;
      const std::vector<double> w = dcp_weights(l, base_e, &g);
      want_g.set({t, h}, g);
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t r = 0; r < W; ++r) acc += w[static_cast<size_t>(r)] * partials.get({r, t, h, d});
        want.set({t, h, d}, acc);
      }
    }
  expect_oracle_finite(want, false, "output");
  x.arena.to_device();
  call(x, [&] { dcp_lse_combine(x.arena.dev(partials), x.arena.dev(lses), base_e, x.arena.dev(out), x.arena.dev(global)); });
  expect_close(out, want, tolerance(out_dt, DType::f32), "output");
  expect_lse_close(global, want_g, 1e-4, "global LSE");
}

// ==== zero_kv_blocks / page_utils =================================================================
void run_zero_kv_blocks(Ctx& x) {
  const OpCase& c = x.c;
  const ShapeDef& s = x.s;
  const int64_t nb = s.num_pages;
  const ops::testing::KVCache cache = arena_kv_cache(x.arena, c.layout, nb, s.page, s.hkv, s.dim, c.dtype);
  fill_uniform(cache.backing, x.rng);
  x.arena.mark_output(cache.backing);
  // the segments of layer 1: one per block when its [H, N, C] interior is one dense run, else one
  // per head ([N, C] dense): what kv/'s KVBlockZeroer builds for the layout
  const Tensor layer = cache.k.permute({0, 2, 1, 3});  // [B, H, N, D] view of K within [B, H, N, C]
  const int64_t es = cache.backing.element_size();
  const int64_t C = 2 * s.dim, H = s.hkv, N = s.page;
  const int64_t sh = layer.stride(1), sn = layer.stride(2);
  const bool block_dense = (sn == C && sh == N * C) || (sh == C && sn == H * C);
  struct Seg { int64_t off_elems, stride_elems, size_elems; };
  std::vector<Seg> segs;
  if (block_dense) segs.push_back({0, layer.stride(0), H * N * C});
  else
    for (int64_t h = 0; h < H; ++h) segs.push_back({h * sh, layer.stride(0), N * C});
  std::vector<int64_t> ids = {nb - 1, 0, 2};
  const DType id_dt = kv_dtype(c);
  Tensor block_ids = x.arena.alloc({static_cast<int64_t>(ids.size())}, id_dt);
  for (size_t i = 0; i < ids.size(); ++i) block_ids.set({static_cast<int64_t>(i)}, static_cast<double>(ids[i]));
  const int64_t S = static_cast<int64_t>(segs.size());
  Tensor addrs = x.arena.alloc({S}, DType::i64), strides = x.arena.alloc({S}, DType::i64),
         sizes = x.arena.alloc({S}, DType::i64);
  // the oracle: the same runs zeroed in a copy of the backing
  const Tensor ref_base = storage_tensor(cache.backing).clone();
  const int64_t k_off = cache.k.byte_offset() - cache.backing.byte_offset();  // layer 1's K in the backing
  for (const Seg& g : segs)
    for (int64_t b : ids)
      std::memset(static_cast<char*>(ref_base.data()) + cache.k.byte_offset() + (b * g.stride_elems + g.off_elems) * es,
                  0, static_cast<size_t>(g.size_elems * es));
  x.arena.to_device();  // the device copy exists now: its addresses go into the table
  const char* base = static_cast<const char*>(x.arena.dev(cache.backing).data());
  for (int64_t i = 0; i < S; ++i) {
    const Seg& g = segs[static_cast<size_t>(i)];
    addrs.at<int64_t>({i}) = static_cast<int64_t>(reinterpret_cast<uintptr_t>(base + k_off + g.off_elems * es));
    strides.at<int64_t>({i}) = g.stride_elems * es / 4;
    sizes.at<int64_t>({i}) = g.size_elems * es / 4;
  }
  x.arena.to_device();
  call(x, [&] { zero_kv_blocks(x.arena.dev(addrs), x.arena.dev(strides), x.arena.dev(sizes), x.arena.dev(block_ids)); });
  const int64_t n = cache.backing.nbytes();
  const auto* got = static_cast<const uint8_t*>(cache.backing.data());
  const auto* want = static_cast<const uint8_t*>(ref_base.data()) + cache.backing.byte_offset();
  for (int64_t i = 0; i < n; ++i)
    if (got[i] != want[i]) {
      ADD_FAILURE() << "cache byte " << i << " of " << n << ": " << int(got[i]) << ", want " << int(want[i]);
      break;
    }
}

// A block table [R, width] (kStrided: every other column of a wider allocation) of distinct ids.
Tensor index_table(Ctx& x, int64_t R, int64_t width, DType dt) {
  Tensor t = (x.c.opts & kStrided) ? x.arena.alloc({R, 2 * width}, dt).slice(1, 0, 2 * width, 2)
                                   : x.arena.alloc({R, width}, dt);
  std::vector<int64_t> ids(static_cast<size_t>(R * width));
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), x.rng);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < width; ++j) t.set({r, j}, static_cast<double>(ids[static_cast<size_t>(r * width + j)]));
  return t;
}

void run_copy_page_indices(Ctx& x) {
  const DType dt = x.c.dtype;
  const int64_t R = static_cast<int64_t>(x.s.kv_lens.size()), width = 13;
  const Tensor bt = index_table(x, R, width, dt);
  std::vector<int32_t> ip{0};
  for (int64_t r = 0; r < R; ++r) ip.push_back(ip.back() + static_cast<int32_t>((x.s.kv_lens[r] + 3) / 4));
  const Tensor indptr_g = x.arena.adopt(Tensor::from_vector(ip).to(dt));
  const Tensor out = x.arena.alloc({ip.back() + 3}, dt);  // 3 entries past indptr[R]: never written
  fill_int(out, kIntPoison);
  x.arena.mark_output(out);
  std::vector<int64_t> want(static_cast<size_t>(ip.back() + 3), kIntPoison);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < ip[r + 1] - ip[r]; ++i) want[static_cast<size_t>(ip[r] + i)] = static_cast<int64_t>(bt.get({r, i}));
  x.arena.to_device();
  call(x, [&] { copy_page_indices(x.arena.dev(out), x.arena.dev(bt), x.arena.dev(indptr_g)); });
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(static_cast<int64_t>(out.get({static_cast<int64_t>(i)})), want[i]) << "paged_kv_indices[" << i << "]";
}

void run_mamba_align(Ctx& x) {
  const DType dt = x.c.dtype;
  const int64_t R = static_cast<int64_t>(x.s.kv_lens.size()), width = 12, bs = 4, n_out = 2;
  const Tensor bt = index_table(x, R, width, dt);
  std::vector<int64_t> lens;
  for (int64_t r = 0; r < R; ++r) lens.push_back(x.s.kv_lens[r]);  // start = (len-1)/bs <= 9
  const Tensor seq = x.arena.adopt(Tensor::from_vector(lens).to(dt));
  const Tensor out = (x.c.opts & kStrided) ? x.arena.alloc({n_out, R}, dt).transpose(0, 1) : x.arena.alloc({R, n_out}, dt);
  fill_int(out, kIntPoison);
  x.arena.mark_output(out);
  x.arena.to_device();
  call(x, [&] { mamba_align_block_table(x.arena.dev(out), x.arena.dev(bt), x.arena.dev(seq), bs); });
  for (int64_t r = 0; r < R; ++r) {
    const int64_t start = std::max<int64_t>((lens[static_cast<size_t>(r)] - 1) / bs, 0);
    for (int64_t j = 0; j < n_out; ++j)
      EXPECT_EQ(out.get({r, j}), bt.get({r, start + j})) << "out[" << r << ", " << j << "]";
  }
}

void run_kvfp8_dequant(Ctx& x) {
  const OpCase& c = x.c;
  const ShapeDef& s = x.s;
  const DType kv_dt = kv_dtype(c), out_dt = c.dtype;
  const int64_t R = 2, P = 3, nb = s.num_pages;
  const ops::testing::KVCache cache = arena_kv_cache(x.arena, c.layout, nb, s.page, s.hkv, s.dim, kv_dt);
  fill_uniform(cache.backing, x.rng, -4, 4);
  // request 0: pages 3, 1, 0 (0 = padding); request 1: 2, -1 (padding), nb - 1
  const std::vector<int32_t> tbl = {3, 1, 0, 2, -1, static_cast<int32_t>(nb - 1)};
  const Tensor bt = x.arena.adopt(Tensor::from_vector(tbl, Dims{R, P}));
  const Tensor ks = x.arena.alloc({1}, DType::f32), vs = x.arena.alloc({1}, DType::f32);
  ks.at<float>({0}) = 0.75f;
  vs.at<float>({0}) = 1.5f;
  const ops::testing::KVCache out = arena_kv_cache(x.arena, c.layout, R * P + 1, s.page, s.hkv, s.dim, out_dt);
  fill_nan(out.backing);
  x.arena.mark_output(out.backing);
  Tensor want_k = Tensor::empty({R * P + 1, s.page, s.hkv, s.dim}, out_dt), want_v = want_k.clone();
  fill_nan(want_k);
  fill_nan(want_v);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < P; ++j) {
      const int32_t page = tbl[static_cast<size_t>(r * P + j)];
      if (page <= 0) continue;
      const int64_t m = r * P + 1 + j;
      for (auto [src, dst, sc] : {std::tuple{cache.k, want_k, 0.75f}, std::tuple{cache.v, want_v, 1.5f}}) {
        const std::vector<double> v = src.select(0, page).contiguous().to_double_vector();
        const Tensor d = dst.select(0, m);
        for (size_t i = 0; i < v.size(); ++i)
          store_from_double(static_cast<char*>(d.data()) + static_cast<int64_t>(i) * d.element_size(), out_dt,
                            static_cast<float>(v[i]) * sc);
      }
    }
  x.arena.to_device();
  call(x, [&] {
    kvfp8_dequant(x.arena.dev(cache.k), x.arena.dev(cache.v), x.arena.dev(bt), x.arena.dev(ks), x.arena.dev(vs),
                  x.arena.dev(out.k), x.arena.dev(out.v));
  });
  expect_close_nan_equal(out.k, want_k, tolerance(out_dt), "out_k_cache");
  expect_close_nan_equal(out.v, want_v, tolerance(out_dt), "out_v_cache");
}

}  // namespace

// ==== public ======================================================================================
const char* op_name(Op op) {
  switch (op) {
    case Op::paged_attention: return "paged_attention";
    case Op::reshape_and_cache_flash: return "reshape_and_cache_flash";
    case Op::merge_attn_states: return "merge_attn_states";
    case Op::mask_empty_context_lse: return "mask_empty_context_lse";
    case Op::cascade_attention: return "cascade_attention";
    case Op::dcp_prefill_attention: return "dcp_prefill_attention";
    case Op::copy: return "copy";
    case Op::scaled_copy: return "scaled_copy";
    case Op::dcp_lse_scale_pack: return "dcp_lse_scale_pack";
    case Op::dcp_lse_combine: return "dcp_lse_combine";
    case Op::zero_kv_blocks: return "zero_kv_blocks";
    case Op::copy_page_indices: return "copy_page_indices";
    case Op::mamba_align_block_table: return "mamba_align_block_table";
    case Op::kvfp8_dequant: return "kvfp8_dequant";
  }
  return "?";
}

std::string case_name(const OpCase& c) {
  std::string n = dtype_tag(c.dtype);
  if (c.kv != Kv::none) ((n += '_') += kv_role(c.op)) += std::string("_") + dtype_tag(kv_dtype(c));
  if (c.layout != kNoLayout) (n += '_') += ops::testing::layout_name(c.layout);
  n += c.dev == Dev::cpu ? "_cpu" : "_cuda";
  if (c.path != Path::none) (n += '_') += path_tag(c.path);
  (n += '_') += shape_def(c.shape).name;
  return n + opts_tag(c.opts, c.op);
}

void PrintTo(const OpCase& c, std::ostream* os) { *os << op_name(c.op) << '/' << case_name(c); }

std::vector<OpCase> op_cases(Op op, Dev dev) {
  std::vector<OpCase> out;
  std::set<std::string> seen;
  for (const Line& l : kRegistry) {
    if (l.op != op) continue;
    for (DType dt : l.dtypes)
      for (Kv kv : l.kvs)
        for (int layout : l.layouts)
          for (Dev d : l.devs) {
            if (d != dev) continue;
            for (Path p : dev == Dev::cpu ? kNoPath : l.paths) {
              const OpCase c{op, dt, kv, layout, d, p, l.shape, l.opts};
              if (seen.insert(case_name(c)).second) out.push_back(c);
            }
          }
  }
  return out;
}

double tolerance(DType stored, std::optional<DType> computed) {
  return std::max(tol_row(stored).store, computed ? tol_row(*computed).compute : 0.0);
}

// ---- kernel paths --------------------------------------------------------------------------------
namespace {
using cuda_impl::k::kOptStreamK;  // routing.h decode option bits
using cuda_impl::k::kOptStreamKFp8;
using cuda_impl::k::kOptStreamKMixed;
int path_min_cc(Path p) { return p == Path::page_decode || p == Path::prefill_wgmma ? 90 : 0; }
}  // namespace

ScopedKernelPath::ScopedKernelPath(Path p) {
  // float32 caches have one path: nothing to force
  if (p == Path::none || p == Path::automatic || p == Path::f32) return;
  active_ = true;
  decode_opts_ = cuda_impl::decode_options();
  // every router off, then the one path on
  const int opts = decode_opts_ & ~(kOptStreamK | kOptStreamKFp8 | kOptStreamKMixed);
  cuda_impl::set_decode_options(p == Path::streamk ? opts | kOptStreamK : opts);
  cuda_impl::set_prefill_kernel_mode(p == Path::prefill_mma || p == Path::prefill_wgmma ? 2 : 1);
  cuda_impl::set_prefill_hopper_mode(p == Path::prefill_wgmma ? 2 : 1);
  cuda_impl::set_small_decode_mode(p == Path::small_decode ? 2 : 1);
  cuda_impl::set_page_decode_mode(p == Path::page_decode ? 2 : 1);
}

ScopedKernelPath::~ScopedKernelPath() {
  if (!active_) return;
  cuda_impl::set_decode_options(decode_opts_);
  cuda_impl::set_prefill_kernel_mode(0);
  cuda_impl::set_prefill_hopper_mode(0);
  cuda_impl::set_small_decode_mode(0);
  cuda_impl::set_page_decode_mode(0);
}

PathCounters PathCounters::now() {
  PathCounters c;
  c.prefill = cuda_impl::prefill_kernel_launches();
  c.hopper = cuda_impl::prefill_hopper_launches();
  c.page = cuda_impl::page_decode_launches();
  c.small = cuda_impl::small_decode_launches();
  c.streamk = cuda_impl::streamk_launches();
  c.f32 = cuda_impl::f32_attention_launches();
  return c;
}

std::string path_mismatch(Path p, const PathCounters& b, const PathCounters& a) {
  if (p == Path::none || p == Path::automatic) return "";
  const int64_t prefill = a.prefill - b.prefill, hopper = a.hopper - b.hopper, page = a.page - b.page,
                small = a.small - b.small, streamk = a.streamk - b.streamk, f32 = a.f32 - b.f32;
  const bool want_prefill = p == Path::prefill_mma || p == Path::prefill_wgmma;
  const bool ok = (prefill > 0) == want_prefill && (hopper > 0) == (p == Path::prefill_wgmma) &&
                  (page > 0) == (p == Path::page_decode) && (small > 0) == (p == Path::small_decode) &&
                  (streamk > 0) == (p == Path::streamk) && (f32 > 0) == (p == Path::f32);
  if (ok) return "";
  std::string why = "launches: prefill " + std::to_string(prefill) + ", wgmma " + std::to_string(hopper) + ", page decode " +
                    std::to_string(page) + ", small decode " + std::to_string(small) + ", stream-K " +
                    std::to_string(streamk) + ", float32 " + std::to_string(f32);
  if (want_prefill) why += std::string("; last prefill choice: ") + cuda_impl::last_prefill_kernel_reason();
  return why;
}

void run_op_case(const OpCase& c) {
  if (c.dev == Dev::cuda) {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    const int cc = path_min_cc(c.path);
    if (cc > 0 && kvattn::cuda::compute_capability(0) < cc)
      GTEST_SKIP() << "kernel path " << path_tag(c.path) << " needs compute capability " << cc / 10 << "." << cc % 10;
  }
  const std::string name = std::string(op_name(c.op)) + "/" + case_name(c);
  SCOPED_TRACE(name);
  Ctx x(c, name_seed(name));
  switch (c.op) {
    case Op::paged_attention: return run_paged_attention(x);
    case Op::reshape_and_cache_flash: return run_reshape_and_cache(x);
    case Op::merge_attn_states: return run_merge(x);
    case Op::mask_empty_context_lse: return run_mask_empty_context_lse(x);
    case Op::cascade_attention: return run_cascade(x);
    case Op::dcp_prefill_attention: return run_dcp_prefill(x);
    case Op::copy:
    case Op::scaled_copy: return run_copy(x);
    case Op::dcp_lse_scale_pack: return run_dcp_scale_pack(x);
    case Op::dcp_lse_combine: return run_dcp_combine(x);
    case Op::zero_kv_blocks: return run_zero_kv_blocks(x);
    case Op::copy_page_indices: return run_copy_page_indices(x);
    case Op::mamba_align_block_table: return run_mamba_align(x);
    case Op::kvfp8_dequant: return run_kvfp8_dequant(x);
  }
}

}  // namespace kvattn::ops::harness
