#include <gtest/gtest.h>

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
  c.layout = "BHLNC";
  RunStats s = run_trace(c, small_trace(6));
  EXPECT_TRUE(s.all_outputs_correct);
  EXPECT_EQ(s.layout, "BHLNC");
  c = small_config();
  c.kv_cache_dtype = "fp8_e4m3";
  c.layout = "HND";
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
  c = small_config();
  c.layout = "XYZ";
  EXPECT_THROW(run_trace(c, small_trace(2)), InvalidArgument);
}
