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
std::atomic<bool> g_force_generic{false}, g_no_avx512{false};
}
void set_force_generic_kernel(bool on) { g_force_generic.store(on); }
void set_disable_avx512_kernel(bool on) { g_no_avx512.store(on); }

bool attention_decode_ok(const AttnKernelParams& p) {
  return !p.complex_mask && p.k_st[3] == 1 && p.v_st[3] == 1 && p.dims->head_dim % 8 == 0;
}

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

  // Work items: (request, KV heads, tile of query rows).
  // * Requests whose query rows per KV head (q_len x group) fit the decode kernel form one tile
  //   each and run that kernel (when the layout and mask allow it).  An item takes as many KV
  //   heads as keeps >= 2 items per thread: a page's K (and V) rows of all heads are then one
  //   contiguous run, which the memory system streams far better than one head's rows at a
  //   head-stride apart (measured: 0.99 vs 0.73 of the copy bandwidth on a 16-core Xeon).
  //   With fewer items than that even at one head per item, long requests are split over
  //   their keys (>= kMinSplitKeys each) and the partial states merged afterwards.
  // * Other requests: tiles of <= 64 query rows; later tiles of a causal request see more
  //   keys, so they go first and the dynamic schedule ends with small items; all heads per
  //   item only when there is plenty of work and the f32 tiles stay small.
  const int64_t group = d.num_qo_heads / d.num_kv_heads;
  const int64_t q_tile = std::max<int64_t>(1, 64 / group);
  const bool decode_ok = attention_decode_ok(p);
  const auto is_decode = [&](int64_t q_len) { return decode_ok && q_len * group <= kDecodeMaxRows; };
  int64_t dec_tiles = 0, gen_tiles = 0;
  for (int64_t r = 0; r < d.batch; ++r) {
    const int64_t ql = b.q_begin[r + 1] - b.q_begin[r];
    if (ql == 0) continue;
    if (is_decode(ql)) ++dec_tiles;
    else gen_tiles += (ql + q_tile - 1) / q_tile;
  }
  const int threads = ThreadPool::instance().num_threads();
  const int64_t gen_heads =
      gen_tiles >= 8 * threads && d.num_kv_heads * group * q_tile <= 256 ? d.num_kv_heads : 1;
  const int64_t other_items = gen_tiles * (d.num_kv_heads / gen_heads);
  int64_t dec_heads = 1;
  for (int64_t h = d.num_kv_heads; h > 1; --h)
    if (d.num_kv_heads % h == 0 && dec_tiles * (d.num_kv_heads / h) + other_items >= 2 * threads) {
      dec_heads = h;
      break;
    }
  // Keys per tile: the converted K and V tiles ([heads, tile, D] f32) stay within ~64 KiB.
  p.key_tile = std::max<int64_t>(8, std::min<int64_t>(64, 16384 / (gen_heads * d.head_dim)));
  p.decode = decode_ok;
  constexpr int64_t kMinSplitKeys = 512;
  const int64_t base_items = dec_tiles * (d.num_kv_heads / dec_heads) + other_items;
  const int64_t want_splits =
      base_items >= 2 * threads || dec_tiles == 0 ? 1 : (2 * threads + base_items - 1) / base_items;
  std::vector<AttnWorkItem> items, merges;
  int32_t parts = 0;
  int64_t max_split_rows = 0;
  for (int64_t r = 0; r < d.batch; ++r) {
    const int64_t q0 = b.q_begin[r], q1 = b.q_begin[r + 1];
    if (q1 == q0) continue;
    const bool dec = is_decode(q1 - q0);
    const int64_t tile_q = dec ? q1 - q0 : q_tile, heads = dec ? dec_heads : gen_heads;
    const int64_t ntiles = (q1 - q0 + tile_q - 1) / tile_q;
    const int64_t kv = b.kv_len[r];
    const int64_t splits = dec ? std::max<int64_t>(1, std::min(want_splits, kv / kMinSplitKeys)) : 1;
    for (int64_t tile = ntiles - 1; tile >= 0; --tile)
      for (int64_t kh = 0; kh < d.num_kv_heads; kh += heads) {
        AttnWorkItem it{static_cast<int32_t>(r), static_cast<int32_t>(kh), static_cast<int32_t>(heads),
                        q0 + tile * tile_q, std::min(q1, q0 + (tile + 1) * tile_q)};
        if (splits == 1) {
          items.push_back(it);
          continue;
        }
        AttnWorkItem m = it;
        m.part = parts;
        m.num_parts = static_cast<int32_t>(splits);
        merges.push_back(m);
        max_split_rows = std::max(max_split_rows, (it.t1 - it.t0) * group);
        for (int64_t s = 0; s < splits; ++s) {
          AttnWorkItem piece = it;
          piece.k0 = kv * s / splits;
          piece.k1 = kv * (s + 1) / splits;
          piece.part = parts++;
          items.push_back(piece);
        }
      }
  }
  // Partial slots (reused across calls on this thread).
  thread_local std::vector<float> part_buf;
  if (parts > 0) {
    p.part_stride = attention_part_floats(dec_heads, max_split_rows, d.head_dim);
    const size_t need = static_cast<size_t>(parts * p.part_stride);
    if (part_buf.size() < need) part_buf.resize(need);
    p.parts = part_buf.data();
  }
  // Instruction set: AVX512-BF16 > AVX2 + FMA + F16C > baseline, as the CPU allows.
  static const bool has_avx2 = cpu_has_avx2_fma(), has_avx512 = cpu_has_avx512bf16();
  const int isa = g_force_generic.load() ? 0 : has_avx512 && !g_no_avx512.load() ? 2 : has_avx2 ? 1 : 0;
  ThreadPool::instance().parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
    if (isa == 2) attention_items_avx512bf16(p, items.data() + i0, i1 - i0);
    else if (isa == 1) attention_items_avx2(p, items.data() + i0, i1 - i0);
    else attention_items_generic(p, items.data() + i0, i1 - i0);
  });
  if (merges.empty()) return;
  ThreadPool::instance().parallel_for(static_cast<int64_t>(merges.size()), 1, [&](int64_t i0, int64_t i1) {
    if (isa == 2) attention_merge_avx512bf16(p, merges.data() + i0, i1 - i0);
    else if (isa == 1) attention_merge_avx2(p, merges.data() + i0, i1 - i0);
    else attention_merge_generic(p, merges.data() + i0, i1 - i0);
  });
}

}  // namespace kvattn::ops::cpu
