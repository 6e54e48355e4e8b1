// Fuzz target for the KV-cache planner: arbitrary bytes become a model geometry (layer kinds,
// heads, head size, dtype, window, Mamba state) and plan options (block size, KV dtype,
// layout, memory budget, max length), then plan_kv_cache runs, and layout merging runs on
// byte-derived candidate lists.  Any input may be rejected, but only with a kvattn::Error;
// anything else (a crash, another exception, a sanitizer report) is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvattn/core/error.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/kv/model_config.h"

namespace {

struct Bytes {
  const uint8_t* p;
  size_t n, i = 0;
  uint8_t u8() { return i < n ? p[i++] : 0; }
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(u8() % static_cast<uint64_t>(hi - lo + 1)); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in{data, size};
  using namespace kvattn;
  try {
    ModelConfig m;
    m.name = "fuzz";
    m.num_hidden_layers = in.range(0, 12) + (in.u8() % 8 ? 1 : 0);
    m.num_key_value_heads = in.range(0, 8) + (in.u8() % 8 ? 1 : 0);
    m.num_attention_heads = m.num_key_value_heads * in.range(0, 4) + (in.u8() % 8 ? 0 : 1);
    m.head_dim = in.range(0, 5) * 32 + (in.u8() % 8 ? 0 : in.range(-1, 1));
    const DType dtypes[] = {DType::bf16, DType::f16, DType::f32, DType::fp8_e4m3, DType::i8};
    m.dtype = dtypes[in.u8() % 8 ? 0 : in.u8() % 5];
    m.max_model_len = in.range(0, 64) * 128 + (in.u8() % 8 ? 0 : in.range(-2, 2));
    if (in.u8() % 3 == 0) m.sliding_window = in.range(0, 4096);
    const bool hybrid = in.u8() % 4 == 0;
    for (int64_t i = 0; i < m.num_hidden_layers; ++i) {
      const uint8_t k = in.u8() % (hybrid ? 3 : 2);
      m.layer_kinds.push_back(k == 0 ? ModelLayerKind::full_attention
                                     : (k == 1 ? ModelLayerKind::sliding_window : ModelLayerKind::mamba));
    }
    if (hybrid) {
      MambaGeometry g;
      g.num_heads = in.range(0, 64);
      g.head_dim = in.range(0, 128);
      g.d_state = in.range(0, 128);
      g.n_groups = in.range(0, 8);
      g.conv_kernel = in.range(0, 6);
      g.intermediate_size = in.range(0, 64) * 64;
      m.mamba = g;
    }
    PlanOptions o;
    if (in.u8() % 2) o.block_size = in.range(-1, 8) * 16 + in.range(0, 1);
    const char* kv_dtypes[] = {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16", "bogus"};
    o.kv_cache_dtype = parse_kv_cache_dtype(kv_dtypes[in.u8() % 7]);
    const char* layouts[] = {"auto", "LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", "NHD", "HND", "X"};
    o.layout = parse_layout_option(layouts[in.u8() % 10]);
    o.gpu_memory = in.range(0, 255) * (int64_t{1} << in.range(10, 30));
    if (in.u8() % 2) o.max_model_len = in.range(-1, 64) * 64;
    o.max_num_batched_tokens = in.range(0, 32) * 256;
    const KVPlan plan = plan_kv_cache(m, o);
    // A plan that was accepted must be self-consistent.
    if (plan.config.num_blocks < 2 || plan.views.size() != static_cast<size_t>(m.num_hidden_layers))
      __builtin_trap();
  } catch (const Error&) {
  }
  try {
    std::vector<LayoutList> lists(1 + in.u8() % 4);
    for (auto& l : lists)
      for (int k = in.u8() % 7; k > 0; --k) l.push_back(static_cast<KVCacheLayout>(in.u8() % 6));
    const LayoutList merged = merge_supported_layouts(lists);
    for (KVCacheLayout c : merged)
      for (const auto& l : lists)
        if (std::find(l.begin(), l.end(), c) == l.end()) __builtin_trap();  // must be in every list
  } catch (const Error&) {
  }
  return 0;
}
