#include <gtest/gtest.h>

#include <random>

#include "kvattn/core/error.h"
#include "kvattn/engine/runner.h"
#include "kvattn/engine/trace.h"

using namespace kvattn;
using namespace kvattn::engine;

namespace {

Trace small_trace(int n, int32_t prompt_base = 20) {
  Trace t;
  for (int i = 0; i < n; ++i) {
    TraceRequest r;
    r.id = i;
    r.arrival_step = i / 3;
    r.prompt_len = prompt_base + 13 * i % 90;
    r.output_len = 3 + i % 6;
    if (i % 2 == 0) {
      r.shared_prefix_id = 0;
      r.shared_prefix_len = std::min<int32_t>(32, r.prompt_len);
    }
    t.requests.push_back(r);
  }
  return t;
}

RunConfig small_config() {
  RunConfig c;
  c.model = "tiny-llama";
  c.num_layers = 2;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 96;
  c.max_model_len = 512;
  c.gpu_memory = 4LL << 20;
  return c;
}

}  // namespace

TEST(Runner, ServesATraceAndEveryCheckPasses) {
  RunConfig c = small_config();
  Trace t = small_trace(12);
  RunStats s = run_trace(c, t);
  EXPECT_TRUE(s.all_outputs_correct);
  EXPECT_EQ(s.num_requests, 12);
  EXPECT_GT(s.steps, 5);
  EXPECT_EQ(s.checks_passed, s.steps);  // one layer checked every step
  EXPECT_GT(s.checked_tokens, s.steps);
  EXPECT_LT(s.max_check_error, 3e-2);
  int64_t outputs = 0;
  for (const auto& r : t.requests) outputs += r.output_len;
  EXPECT_EQ(s.output_tokens, outputs);
  EXPECT_GT(s.peak_blocks_used, 0);
  int64_t tokens = 0;
  for (const auto& st : s.timings) tokens += st.tokens;
  EXPECT_EQ(tokens, s.prefill_tokens + s.decode_tokens);
}

TEST(Runner, OversubscribedCachePreemptsAndFinishes) {
  RunConfig c = small_config();
  c.gpu_memory = 640LL << 10;  // 40 blocks of 16 KiB (2 layers x 2 heads x 16 tokens x 64 x K,V x 2 B)
  c.max_num_batched_tokens = 256;
  c.admission = "optimistic";  // admit on prefill blocks only, so decode growth must preempt
  Trace t;
  for (int i = 0; i < 10; ++i) t.requests.push_back({i, 0, 100 + i, 60});  // 10 blocks each at the end
  RunStats s = run_trace(c, t);
  EXPECT_GT(s.preemptions, 0);
  EXPECT_TRUE(s.all_outputs_correct);
  EXPECT_EQ(s.checks_passed, s.steps);
}

TEST(Runner, TwoGroupsLayoutsAndFp8) {
  RunConfig c = small_config();
  c.model = "tiny-gemma2";  // sliding-window and full groups
  c.num_layers = 4;
  c.layout = KVCacheLayout::BHLNC;
  RunStats s = run_trace(c, small_trace(6));
  EXPECT_TRUE(s.all_outputs_correct);
  EXPECT_EQ(s.layout, "BHLNC");
  c = small_config();
  c.kv_cache_dtype = KVCacheDType::Fp8E4M3;
  c.layout = layout_from_name("HND");
  c.block_size = 32;
  s = run_trace(c, small_trace(6));
  EXPECT_TRUE(s.all_outputs_correct);
  EXPECT_EQ(s.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(s.checks_passed, s.steps);
}

TEST(Runner, MismatchStopsTheRunWithAReport) {
  RunConfig c = small_config();
  c.corrupt_output_at_step = 2;
  try {
    run_trace(c, small_trace(6));
    FAIL() << "the corrupted output was not detected";
  } catch (const RunMismatch& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("step 2"), std::string::npos) << m;
    EXPECT_NE(m.find("reference"), std::string::npos) << m;
  }
}

TEST(Runner, BadConfigurationIsAClearError) {
  RunConfig c = small_config();
  c.cascade = "sometimes";
  EXPECT_THROW(run_trace(c, small_trace(2)), InvalidArgument);
  c = small_config();
  EXPECT_THROW(run_trace(c, Trace{}), InvalidArgument);
  c.num_layers = 99;
  EXPECT_THROW(run_trace(c, small_trace(2)), InvalidArgument);
  EXPECT_THROW((void)parse_layout_option("XYZ"), InvalidArgument);  // the CLI's --layout parse
}

TEST(Runner, RejectedRequestNamesItsTraceLineAndTheOthersAreServed) {
  // A request the trace parser did not bound (an API caller's trace): it needs more blocks than
  // the whole cache, so it is rejected by itself, naming its source line; the rest run.
  RunConfig c = small_config();
  c.gpu_memory = 640LL << 10;  // 40 blocks of 16 tokens: 39 usable
  c.max_num_batched_tokens = 256;
  Trace t = small_trace(4);
  t.requests[2].prompt_len = 700;  // 44 blocks
  t.requests[2].shared_prefix_id = -1;
  t.requests[2].shared_prefix_len = 0;
  for (size_t i = 0; i < t.requests.size(); ++i) t.requests[i].source_line = static_cast<int64_t>(10 + i);
  const RunStats s = run_trace(c, t);
  ASSERT_EQ(s.rejected.size(), 1u);
  EXPECT_NE(s.rejected[0].find("trace line 12"), std::string::npos) << s.rejected[0];
  EXPECT_NE(s.rejected[0].find("only 39"), std::string::npos) << s.rejected[0];
  EXPECT_TRUE(s.all_outputs_correct);
  int64_t outputs = 0;
  for (size_t i = 0; i < t.requests.size(); ++i)
    if (i != 2) outputs += t.requests[i].output_len;
  EXPECT_EQ(s.output_tokens, outputs);
}

TEST(Runner, DcpInterleaveMustDivideTheBlockSize) {
  RunConfig c = small_config();
  c.dcp = 2;
  c.dcp_interleave = 3;
  try {
    run_trace(c, small_trace(2));
    FAIL() << "--dcp-interleave 3 with 16-token blocks was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("must divide the KV cache block size 16"), std::string::npos) << e.what();
  }
}

TEST(Runner, RandomTracesOnTinyModelsKeepEveryCheck) {
  // The runner-level property, small: random traces with shared prefixes, chunking and idle
  // gaps on a single-group and a multi-group model, every step checked against the reference,
  // every request finishing with its output_len; the scheduler's invariants hold at the end.
  std::mt19937_64 rng(7);
  for (const char* model : {"tiny-llama", "tiny-gemma2"}) {
    for (int trial = 0; trial < 2; ++trial) {
      RunConfig c = small_config();
      c.model = model;
      c.num_layers = 2;
      c.max_num_batched_tokens = 32 << (rng() % 3);
      c.max_num_seqs = 2 + static_cast<int32_t>(rng() % 6);
      c.admission = rng() % 2 ? "reserve" : "optimistic";
      const bool gemma = std::string(model) == "tiny-gemma2";
      c.max_model_len = gemma ? 768 : 512;  // tiny-gemma2's window is 512: longer prompts slide
      c.gpu_memory = (gemma ? 2LL << 20 : 1LL << 20) + static_cast<int64_t>(rng() % 4) * (512LL << 10);
      Trace t;
      int64_t arrival = 0;
      for (int i = 0; i < 6; ++i) {
        TraceRequest r;
        r.id = i;
        arrival += rng() % 5 == 0 ? 1000000 : static_cast<int64_t>(rng() % 3);
        r.arrival_step = arrival;
        r.output_len = 1 + static_cast<int32_t>(rng() % 12);
        r.prompt_len = 1 + static_cast<int32_t>(rng() % (gemma ? 700 : 300));
        if (rng() % 2) {
          r.shared_prefix_id = static_cast<int32_t>(rng() % 2);
          r.shared_prefix_len = std::min<int32_t>(r.prompt_len, 48);
        }
        t.requests.push_back(r);
      }
      const RunStats s = run_trace(c, t);
      EXPECT_TRUE(s.all_outputs_correct) << model << " trial " << trial;
      EXPECT_TRUE(s.rejected.empty());
      EXPECT_EQ(s.checks_passed, s.steps);
      EXPECT_LE(s.steps, s.computed_tokens);  // every step computed something: idle gaps skipped
    }
  }
}
