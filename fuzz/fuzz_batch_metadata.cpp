// Fuzz target for the per-step host pipeline: arbitrary bytes become a batch description
// (limits, block geometry, DCP, requests with prompt/computed/scheduled counts and block ids,
// multimodal ranges, raw positions), which then runs through InputBatch, the reorder, the step
// preparer, every split, the slot mapping, DCP lengths, mm-prefix fills, the Mamba gather, the
// paged-KV builder (with cascade) and the XQA helpers.  Only kvattn::Error may escape a call; it
// is caught here.  Broken invariants on accepted inputs abort (__builtin_trap).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvattn/attention/paged_kv_metadata.h"
#include "kvattn/attention/xqa_mask.h"
#include "kvattn/batch/batch.h"

namespace {

// Coverage counters, printed at exit when KVATTN_FUZZ_STATS is set.
struct Stats {
  long inputs = 0, prepared = 0, paged = 0, slots = 0;
  ~Stats() {
    if (std::getenv("KVATTN_FUZZ_STATS") != nullptr)
      std::fprintf(stderr, "fuzz_batch_metadata: %ld inputs, %ld prepared, %ld paged builds, %ld raw slot maps\n",
                   inputs, prepared, paged, slots);
  }
} g_stats;

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint32_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  uint32_t u16() { return u8() | (u8() << 8); }
  int32_t small_signed(int32_t range) {  // mostly in [0, range), sometimes negative / huge
    const uint32_t tag = u8();
    if (tag == 0xff) return -static_cast<int32_t>(u16());
    if (tag == 0xfe) return static_cast<int32_t>(u16()) * 1024;
    return range > 0 ? static_cast<int32_t>(u16() % static_cast<uint32_t>(range)) : 0;
  }
  bool done() const { return i_ >= n_; }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

#define FUZZ_CHECK(cond) \
  do {                   \
    if (!(cond)) __builtin_trap(); \
  } while (0)

template <typename F>
void guarded(F&& f) {
  try {
    f();
  } catch (const kvattn::Error&) {
    // Rejected input: expected.
  }
}

void run(Reader& in) {
  using namespace kvattn;
  BatchPreparerConfig cfg;
  cfg.max_num_reqs = 1 + in.u8() % 48;
  cfg.max_num_batched_tokens = 1 + in.u16() % 1024;
  cfg.max_model_len = 1 + in.u16() % 2048;
  cfg.block_size = int64_t{1} << (in.u8() % 6);
  cfg.blocks_per_kv_block = 1 + in.u8() % 3;
  cfg.dcp_world_size = 1 + in.u8() % 4;
  cfg.dcp_rank = static_cast<int64_t>(in.u8() % 5);  // sometimes out of range
  cfg.cp_kv_cache_interleave_size = 1 + in.u8() % 8;
  cfg.num_blocks = static_cast<int64_t>(in.u16() % 4096);
  const int32_t threshold = static_cast<int32_t>(1 + in.u8() % 4);

  std::unique_ptr<BatchPreparer> prep;
  guarded([&] { prep = std::make_unique<BatchPreparer>(cfg); });
  if (!prep) return;
  const int64_t width = cfg.max_num_blocks_per_req();
  InputBatch batch(cfg.max_num_reqs, width);

  const int n = static_cast<int>(in.u8() % (cfg.max_num_reqs + 2));
  for (int i = 0; i < n && !in.done(); ++i) {
    RequestState s;
    s.req_id = "r";  // appended, not "r" + std::string: GCC 12 warns (-Wrestrict) on that
    s.req_id += std::to_string(i);
    s.num_prompt_tokens = in.small_signed(cfg.max_model_len + 8);
    s.num_computed_tokens = in.small_signed(cfg.max_model_len + 8);
    s.num_scheduled_tokens = in.small_signed(64);
    const int nb = static_cast<int>(in.u8() % (width + 2));
    for (int k = 0; k < nb; ++k) s.block_ids.push_back(in.small_signed(static_cast<int32_t>(cfg.num_blocks + 4)));
    if (in.u8() % 4 == 0) {
      s.mm_features.push_back({in.u8() % 2 ? "image" : "audio",
                               {in.small_signed(64), in.small_signed(32), std::nullopt}});
    }
    guarded([&] { batch.add_request(s); });
  }

  guarded([&] {
    const bool changed = reorder_batch_to_split_decodes_and_prefills(batch, threshold);
    (void)changed;
    // Region order holds after the reorder.
    int prev = 0;
    for (int64_t r = 0; r < batch.num_reqs(); ++r) {
      const int g = static_cast<int>(classify_request(batch.num_scheduled_tokens()[r],
                                                      batch.num_computed_tokens_cpu()[r],
                                                      batch.num_prompt_tokens()[r], threshold));
      FUZZ_CHECK(g >= prev);
      prev = g;
    }
  });

  const int64_t pad_reqs = batch.num_reqs() + in.u8() % 3;
  const int64_t pad_tokens = static_cast<int64_t>(in.u16() % 1100);
  guarded([&] {
    const CommonAttentionMetadata& cm = prep->prepare(batch, pad_reqs, in.u8() % 2 ? pad_tokens : -1);
    cm.validate();
    ++g_stats.prepared;
    // Slots are PAD or inside the pool.
    const auto slots = cm.slot_mapping.to_vector<int64_t>();
    for (int64_t s : slots) {
      FUZZ_CHECK(s == PAD_SLOT_ID || (s >= 0 && (cfg.num_blocks <= 0 || s < cfg.num_blocks * cfg.block_size)));
    }
    for (int flags = 0; flags < 4; ++flags) {
      const auto sp = split_decodes_and_prefills(cm, threshold, flags & 1, flags & 2);
      FUZZ_CHECK(sp.num_decodes + sp.num_prefills == cm.num_reqs);
      FUZZ_CHECK(sp.num_decode_tokens + sp.num_prefill_tokens == cm.num_actual_tokens);
    }
    const auto s3 = split_decodes_prefills_and_extends(cm, threshold);
    FUZZ_CHECK(s3.num_decodes + s3.num_extends + s3.num_prefills == cm.num_reqs);
    FUZZ_CHECK(s3.num_decode_tokens + s3.num_extend_tokens + s3.num_prefill_tokens == cm.num_actual_tokens);
    guarded([&] { split_prefill_chunks(cm.seq_lens_cpu_upper_bound, 1 + in.u16() % 4096); });

    const auto sp = split_decodes_and_prefills(cm, threshold);
    PagedKVMetadataConfig pc;
    pc.max_num_reqs = cfg.max_num_reqs;
    pc.max_model_len = cfg.max_model_len;
    pc.page_size = cfg.block_size;
    pc.dcp_world_size = cfg.dcp_world_size;
    pc.dcp_rank = cfg.dcp_rank;
    pc.cp_kv_cache_interleave_size = cfg.cp_kv_cache_interleave_size;
    pc.num_blocks = cfg.num_blocks;
    guarded([&] {
      PagedKVMetadataBuilder pb(pc);
      const int64_t prefix = static_cast<int64_t>(in.u8() % 4) * (in.u8() % 2 ? cfg.block_size : 3);
      const auto& md = pb.build(cm, sp.num_decodes, prefix);
      const auto indptr = md.paged_kv_indptr_cpu.to_vector<int32_t>();
      FUZZ_CHECK(static_cast<int64_t>(indptr.size()) == cm.num_reqs + 1);
      FUZZ_CHECK(indptr.back() == md.num_actual_pages);
      ++g_stats.paged;
      FUZZ_CHECK(md.paged_kv_indices.numel() == md.num_actual_pages);
      for (int32_t id : md.paged_kv_indices.to_vector<int32_t>())
        FUZZ_CHECK(id >= 0 && (cfg.num_blocks <= 0 || id < cfg.num_blocks));
    });

    // mm prefix ranges from the batch's features.
    guarded([&] {
      auto ranges = compute_mm_prefix_ranges(batch.mm_features(), in.u8() % 2 ? std::optional<int64_t>(in.u8()) : std::nullopt,
                                             in.u8() % 2, in.u8() % 3);
      Tensor out = Tensor::zeros({cfg.max_num_batched_tokens, 2}, DType::i32);
      const int64_t rows = fill_mm_prefix_query_ranges(out, &ranges, cm.query_start_loc_cpu,
                                                       cm.seq_lens_cpu_upper_bound);
      FUZZ_CHECK(rows == 0 || rows == cm.num_actual_tokens);
      compute_mm_prefix_range_tensor(&ranges, cm.num_reqs);
    });
    guarded([&] {
      mamba_get_block_table_tensor(cm.block_table_tensor, cm.seq_lens_cpu_upper_bound,
                                   {cfg.block_size, static_cast<int64_t>(in.u8() % 3)},
                                   in.u8() % 2 ? "align" : "none");
    });
    guarded([&] {
      const auto dq = compute_decode_query_lens(host_i32_span(cm.query_start_loc_cpu, "qsl"),
                                                sp.num_decodes, sp.num_decode_tokens, in.u8() % 2);
      XqaDecodeMaskCache cache(cfg.max_num_reqs);
      cache.get_decode_mask(dq.q_len_per_req, dq.ragged_q_lens, sp.num_decodes, in.u8() % 2);
    });
    guarded([&] {
      Tensor seq = cm.seq_lens_cpu_upper_bound;
      get_dcp_local_seq_lens(seq, cfg.dcp_world_size, std::nullopt, cfg.cp_kv_cache_interleave_size);
    });
  });

  // Raw per-token slot mapping with fuzzed positions and start locations.
  guarded([&] {
    const int nr = static_cast<int>(in.u8() % 6);
    std::vector<int32_t> qsl{static_cast<int32_t>(in.u8() % 2)};
    for (int r = 0; r < nr; ++r) qsl.push_back(qsl.back() + in.small_signed(8));
    std::vector<int64_t> pos(static_cast<size_t>(in.u8() % 40));
    for (auto& p : pos) p = in.small_signed(static_cast<int32_t>(cfg.max_model_len));
    std::vector<int64_t> out(pos.size());
    SlotMappingParams p{cfg.block_size, cfg.blocks_per_kv_block, cfg.dcp_world_size, cfg.dcp_rank,
                        cfg.cp_kv_cache_interleave_size, cfg.num_blocks};
    compute_slot_mapping(qsl, pos, host_block_table(batch.block_table()), p, out);
    ++g_stats.slots;
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in(data, size);
  ++g_stats.inputs;
  try {
    run(in);
  } catch (const kvattn::Error&) {
  }
  return 0;
}
