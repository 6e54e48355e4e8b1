// Fuzz target for FlashInferMetadataBuilder::build, the per-step planner of the native backend:
// arbitrary bytes become a CommonAttentionMetadata whose scalars (num_reqs, num_actual_tokens,
// max_query_len, max_seq_len, common_prefix_len) and host arrays (query_start_loc, seq_lens,
// block table) may contradict each other: understated max_query_len, decreasing offsets, sequence
// lengths shorter than their query, missing rows.  build() runs on one of a few builders (decode
// threshold, cascade, DCP, page size); it may refuse the step, but only with a kvattn::Error, and
// never reads outside a tensor (ASan).  Reproducers of fixed crashes live in
// fuzz/regressions/fuzz_metadata_builder/ (e.g. max_query_len understating the batch, which read
// query_start_loc_cpu past its end).  KVATTN_FUZZ_STATS=1 prints counts at exit,
// KVATTN_FUZZ_VERBOSE=1 every refusal's message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kvattn/attention/native_backend.h"
#include "kvattn/core/error.h"

namespace {
using namespace kvattn;

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint32_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  uint32_t u16() { return u8() | (u8() << 8); }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

struct Stats {
  long inputs = 0, built = 0, refused = 0;
  ~Stats() {
    if (std::getenv("KVATTN_FUZZ_STATS") != nullptr)
      std::fprintf(stderr, "fuzz_metadata_builder: %ld inputs, %ld built, %ld refused\n", inputs, built, refused);
  }
} g_stats;

constexpr int64_t kMaxReqs = 16, kMaxTokens = 512, kWidth = 32;

// One builder and the layers it reads (kept alive together).  Variants: decode threshold 1 or 4
// (speculative decoding), page size 16 or 64, DCP 1 or 2.
struct Harness {
  LayerRegistry registry;
  std::vector<AttentionLayer> layers;
  BackendConfig cfg;
  std::unique_ptr<FlashInferMetadataBuilder> builder;

  explicit Harness(int variant) {
    cfg.model_dtype = DType::bf16;
    cfg.num_attention_heads = 8;
    cfg.num_kv_heads = 2;
    cfg.head_size = 64;
    cfg.max_model_len = 2048;
    cfg.max_num_seqs = kMaxReqs;
    cfg.max_num_batched_tokens = kMaxTokens;
    cfg.num_sms = 4;
    cfg.flashinfer_workspace_buffer_size = 0;
    cfg.cache_config.kv_cache_layout = KVCacheLayout::LBNHC;
    cfg.layers = &registry;
    if (variant & 1) cfg.num_speculative_tokens = 3;
    if (variant & 4) cfg.decode_context_parallel_size = 2;
    AttentionImplParams p;
    p.num_heads = 8;
    p.num_kv_heads = 2;
    p.head_size = 64;
    p.scale = 0.125;
    auto impl = std::make_shared<FlashInferImpl>(p, cfg);
    layers.push_back(AttentionLayer::make("layers.0", impl));
    registry.add(&layers.back());
    const int64_t page = (variant & 2) ? 64 : 16;
    builder = std::make_unique<FlashInferMetadataBuilder>(FullAttentionSpec(page, 2, 64, DType::bf16),
                                                          std::vector<std::string>{"layers.0"}, cfg);
  }
};

Harness* harness(int variant) {
  static std::unique_ptr<Harness> hs[8];
  auto& h = hs[variant & 7];
  if (!h) {
    try {
      h = std::make_unique<Harness>(variant);
    } catch (const Error&) {
      return nullptr;  // a configuration this build refuses: skip it
    }
  }
  return h.get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in(data, size);
  ++g_stats.inputs;
  Harness* h = harness(static_cast<int>(in.u8()));
  if (h == nullptr) return 0;
  const uint32_t flags = in.u8();
  const int64_t num_reqs = in.u8() % (kMaxReqs + 1);
  // Per request: query length (mostly 1 = decode, else up to 40) and context before it.
  std::vector<int32_t> qsl(static_cast<size_t>(num_reqs + 1), 0), seq(static_cast<size_t>(num_reqs), 0);
  int64_t max_q = 0, max_s = 0;
  for (int64_t r = 0; r < num_reqs; ++r) {
    const uint32_t b = in.u8();
    const int32_t q = (b & 3) ? 1 : static_cast<int32_t>(b >> 2) % 41;
    const int32_t ctx = static_cast<int32_t>(in.u16() % 1500);
    qsl[static_cast<size_t>(r + 1)] = qsl[static_cast<size_t>(r)] + q;
    seq[static_cast<size_t>(r)] = ctx + q;
    max_q = std::max<int64_t>(max_q, q);
    max_s = std::max<int64_t>(max_s, ctx + q);
  }
  int64_t num_tokens = qsl.back();
  // Contradictions, each chosen by a flag bit.
  int64_t max_query_len = max_q;
  if (flags & 0x01) max_query_len = in.u8() % 3;                        // understated (or 0)
  if ((flags & 0x02) && num_reqs > 1) qsl[1 + in.u8() % static_cast<size_t>(num_reqs)] -= 7;  // decreasing
  if ((flags & 0x04) && num_reqs > 0) seq[in.u8() % static_cast<size_t>(num_reqs)] = static_cast<int32_t>(in.u8()) - 8;
  if (flags & 0x08) num_tokens += static_cast<int64_t>(in.u8()) - 128;  // padding, or fewer tokens
  int64_t rows = num_reqs;
  if (flags & 0x10) rows = std::max<int64_t>(0, num_reqs - 1 - static_cast<int64_t>(in.u8() % 2));  // short tensors
  const int64_t common_prefix_len = (flags & 0x20) ? static_cast<int64_t>(in.u8() % 4) * 16 : 0;
  const int64_t reported_reqs = (flags & 0x40) ? num_reqs + static_cast<int64_t>(in.u8() % 3) : num_reqs;

  std::vector<int32_t> table(static_cast<size_t>(std::max<int64_t>(rows, 1) * kWidth));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(1 + (i * 7 + in.u8()) % 4000);
  // Host arrays as views of exactly-sized heap vectors, so ASan sees a read one past their end
  // (a Buffer rounds its allocation up to the alignment).
  std::vector<int32_t> qsl_rows(qsl.begin(), qsl.begin() + (rows + 1));
  std::vector<int32_t> seq_rows(seq.begin(), seq.begin() + rows);
  const Tensor qsl_t = Tensor::from_blob(qsl_rows.data(), {rows + 1}, DType::i32);
  const Tensor seq_t = Tensor::from_blob(seq_rows.data(), {rows}, DType::i32);
  const Tensor bt = Tensor::from_blob(table.data(), {std::max<int64_t>(rows, 1), kWidth}, DType::i32);
  const Tensor slots = Tensor::zeros({std::max<int64_t>(num_tokens, 1)}, DType::i64);

  CommonAttentionMetadata cm;
  cm.query_start_loc = qsl_t;
  cm.query_start_loc_cpu = qsl_t;
  cm.seq_lens = seq_t;
  cm.seq_lens_cpu_upper_bound = (flags & 0x80) ? Tensor() : seq_t;
  cm.num_reqs = reported_reqs;
  cm.num_actual_tokens = num_tokens;
  cm.max_query_len = max_query_len;
  cm.max_seq_len = max_s;
  cm.block_table_tensor = bt;
  cm.slot_mapping = slots;
  cm.causal = true;
  try {
    (void)h->builder->build(common_prefix_len, cm);
    ++g_stats.built;
  } catch (const Error& e) {
    ++g_stats.refused;  // a contradictory step, refused with a typed error: expected
    if (std::getenv("KVATTN_FUZZ_VERBOSE") != nullptr) std::fprintf(stderr, "refused: %s\n", e.what());
  }
  return 0;
}
