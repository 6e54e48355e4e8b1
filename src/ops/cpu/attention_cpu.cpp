// paged_attention on CPU: resolve the batch, cut it into work items, run them on the pool.
#include <algorithm>
#include <atomic>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/thread_pool.h"

namespace kvattn::ops::cpu {

namespace {
struct Fp8Tables {
  float e4m3[256], e5m2[256];
  Fp8Tables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = fp8_e4m3_bits_to_f32(static_cast<uint8_t>(i));
      e5m2[i] = fp8_e5m2_bits_to_f32(static_cast<uint8_t>(i));
    }
  }
};
const Fp8Tables& fp8_tables() {
  static const Fp8Tables t;
  return t;
}
}  // namespace

const float* fp8_e4m3_table() { return fp8_tables().e4m3; }
const float* fp8_e5m2_table() { return fp8_tables().e5m2; }

namespace {
std::atomic<bool> g_force_generic{false};
}
void set_force_generic_kernel(bool on) { g_force_generic.store(on); }

void paged_attention(const PagedAttentionArgs& a, const detail::AttnDims& d) {
  const detail::ResolvedBatch b = detail::resolve_batch(a, d);
  fp8_tables();  // initialise before the workers race for it
  AttnKernelParams p{};
  p.args = &a;
  p.dims = &d;
  p.batch = &b;
  p.q = static_cast<const char*>(a.query.data());
  p.q_dtype = a.query.dtype();
  for (int i = 0; i < 3; ++i) p.q_st[i] = a.query.stride(i);
  p.k = static_cast<const char*>(a.k_cache.data());
  p.v = static_cast<const char*>(a.v_cache.data());
  for (int i = 0; i < 4; ++i) { p.k_st[i] = a.k_cache.stride(i); p.v_st[i] = a.v_cache.stride(i); }
  p.kv_dtype = a.k_cache.dtype();
  p.o = static_cast<char*>(a.out.data());
  p.o_dtype = a.out.dtype();
  for (int i = 0; i < 3; ++i) p.o_st[i] = a.out.stride(i);
  if (a.lse.defined()) {
    p.lse = static_cast<char*>(a.lse.data());
    p.lse_st[0] = a.lse.stride(0);
    p.lse_st[1] = a.lse.stride(1);
  }
  p.lse_base2 = a.lse_base == LseBase::Two;
  if (a.sinks.defined()) { p.sinks = static_cast<const char*>(a.sinks.data()); p.sinks_st = a.sinks.stride(0); }
  p.scale = static_cast<float>(d.sm_scale * a.q_scale * a.k_scale);
  p.cap = static_cast<float>(a.logits_soft_cap);
  p.v_scale = static_cast<float>(a.v_scale);
  p.complex_mask = a.mm_prefix_ranges.defined() || a.xqa_draft_mask.defined();

  // Work items: (request, KV heads, tile of query rows).  Later tiles of a causal request see
  // more keys; they go first so the dynamic schedule ends with small items.  When there is
  // enough work, one item takes every KV head of its rows: a page's K (and V) rows of all
  // heads are then read as one contiguous run, which the memory system streams far better
  // than one head's rows at a head-stride apart.
  const int64_t group = d.num_qo_heads / d.num_kv_heads;
  const int64_t q_tile = std::max<int64_t>(1, 64 / group);
  int64_t tiles = 0;
  for (int64_t r = 0; r < d.batch; ++r) tiles += (b.q_begin[r + 1] - b.q_begin[r] + q_tile - 1) / q_tile;
  const int threads = ThreadPool::instance().num_threads();
  const int64_t heads_per_item =
      tiles >= 8 * threads && d.num_kv_heads * group * q_tile <= 256 ? d.num_kv_heads : 1;
  // Keys per tile: the converted K and V tiles ([heads, tile, D] f32) stay within ~64 KiB.
  p.key_tile = std::max<int64_t>(8, std::min<int64_t>(64, 16384 / (heads_per_item * d.head_dim)));
  std::vector<AttnWorkItem> items;
  for (int64_t r = 0; r < d.batch; ++r) {
    const int64_t q0 = b.q_begin[r], q1 = b.q_begin[r + 1];
    if (q1 == q0) continue;
    const int64_t ntiles = (q1 - q0 + q_tile - 1) / q_tile;
    for (int64_t tile = ntiles - 1; tile >= 0; --tile)
      for (int64_t kh = 0; kh < d.num_kv_heads; kh += heads_per_item)
        items.push_back({static_cast<int32_t>(r), static_cast<int32_t>(kh), static_cast<int32_t>(heads_per_item),
                         q0 + tile * q_tile, std::min(q1, q0 + (tile + 1) * q_tile)});
  }
  static const bool has_avx2 = cpu_has_avx2_fma();
  const bool avx2 = has_avx2 && !g_force_generic.load();
  ThreadPool::instance().parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
    if (avx2) attention_items_avx2(p, items.data() + i0, i1 - i0);
    else attention_items_generic(p, items.data() + i0, i1 - i0);
  });
}

}  // namespace kvattn::ops::cpu
