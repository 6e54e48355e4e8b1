// The wgmma prefill's consumer schedule rule (hopper_sched_for, src/ops/cuda/routing.h): host
// arithmetic only, so it is checked on every build.
#include <gtest/gtest.h>

#include "ops/cuda/routing.h"

namespace kvattn::ops::cuda_impl::k {
namespace {

// A call of B requests with Lq queries over Lkv keys each (paged form: its KV lengths known).
HopperSchedCall call(int64_t B, int64_t Lq, int64_t Lkv, bool causal = true) {
  return HopperSchedCall{.causal = causal, .batch = B, .num_tokens = B * Lq, .kv_keys = B * Lkv};
}

TEST(HopperSchedule, AutomaticFollowsTheUnitsLength) {
  const int automatic = KernelRouting{}.hopper_sched;
  EXPECT_EQ(automatic, -1);  // the library's default: no schedule named
  EXPECT_EQ(kHopperSchedPingpong, 2);  // the indices KVATTN_PREFILL_HOPPER_SCHED=pingpong / turns set
  EXPECT_EQ(kHopperSchedTurns, 3);
  // the benchmark's shapes: short units on pingpong, long ones on turns
  EXPECT_EQ(hopper_sched_for(automatic, call(8, 2048, 2048)), kHopperSchedPingpong);  // mean unit 1,024 keys
  EXPECT_EQ(hopper_sched_for(automatic, call(16, 1024, 1024)), kHopperSchedPingpong);
  EXPECT_EQ(hopper_sched_for(automatic, call(32, 512, 512)), kHopperSchedPingpong);
  EXPECT_EQ(hopper_sched_for(automatic, call(16, 2176, 2176)), kHopperSchedPingpong);  // mixed lengths' mean
  EXPECT_EQ(hopper_sched_for(automatic, call(4, 4096, 4096)), kHopperSchedTurns);      // 2,048 keys
  EXPECT_EQ(hopper_sched_for(automatic, call(1, 8192, 8192)), kHopperSchedTurns);
  EXPECT_EQ(hopper_sched_for(automatic, call(8, 512, 4096)), kHopperSchedTurns);  // chunked: 3,584 + 256
  EXPECT_EQ(hopper_sched_for(automatic, call(1, 2048, 32768)), kHopperSchedTurns);
  EXPECT_EQ(hopper_sched_for(automatic, call(8, 2048, 2048, false)), kHopperSchedTurns);  // non-causal: 2,048
  EXPECT_EQ(hopper_sched_for(automatic, call(8, 1024, 1024, false)), kHopperSchedPingpong);
  // the threshold: 12 key tiles of mean span
  EXPECT_EQ(hopper_sched_for(automatic, call(2, 1, kHopperTurnsMinKeys, false)), kHopperSchedTurns);
  EXPECT_EQ(hopper_sched_for(automatic, call(2, 1, kHopperTurnsMinKeys - 1, false)), kHopperSchedPingpong);
  // decode-like rows over a long context: one-token units, but each spans the context
  EXPECT_EQ(hopper_sched_for(automatic, call(64, 1, 4096)), kHopperSchedTurns);
}

TEST(HopperSchedule, PingpongWhereTheRuleDoesNotApply) {
  const int automatic = -1;
  HopperSchedCall c = call(1, 8192, 8192);
  c.fp8_pages = true;  // fp8 pages: turns lost 3.5 % (the widening warps share the issue slots)
  EXPECT_EQ(hopper_sched_for(automatic, c), kHopperSchedPingpong);
  c = call(1, 8192, 8192);
  c.kv_keys = -1;  // KV lengths unknown on the host (block-table form)
  EXPECT_EQ(hopper_sched_for(automatic, c), kHopperSchedPingpong);
  c = call(0, 0, 0);  // no requests
  EXPECT_EQ(hopper_sched_for(automatic, c), kHopperSchedPingpong);
  c = call(1, 2048, 32768);
  c.window_left = 1023;  // a sliding window caps every unit's span
  EXPECT_EQ(hopper_sched_for(automatic, c), kHopperSchedPingpong);
  c.window_left = kHopperTurnsMinKeys - 1;
  EXPECT_EQ(hopper_sched_for(automatic, c), kHopperSchedTurns);
}

TEST(HopperSchedule, ASettingWins) {
  for (const HopperSchedCall& c : {call(8, 2048, 2048), call(1, 8192, 8192)})
    for (int s = 0; s < 4; ++s) EXPECT_EQ(hopper_sched_for(s, c), s);
  // Anything outside 0..3 is the call's default.
  EXPECT_EQ(hopper_sched_for(7, call(8, 2048, 2048)), kHopperSchedPingpong);
  EXPECT_EQ(hopper_sched_for(-2, call(1, 8192, 8192)), kHopperSchedTurns);
}

}  // namespace
}  // namespace kvattn::ops::cuda_impl::k
