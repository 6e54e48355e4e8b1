// The wgmma prefill's per-call consumer schedule rule (hopper_sched_for, src/ops/cuda/routing.h):
// host arithmetic only, so it is checked on every build.
#include <gtest/gtest.h>

#include "ops/cuda/routing.h"

namespace kvattn::ops::cuda_impl::k {
namespace {

TEST(HopperSchedule, AutomaticByAverageKvLength) {
  const int automatic = KernelRouting{}.hopper_sched;
  EXPECT_EQ(automatic, -1);  // the library's default is the per-call rule
  // The measured shapes: short requests take pingpong, long ones turns.
  EXPECT_EQ(hopper_sched_for(automatic, 512), kHopperSchedPingpong);   // 32 x 512
  EXPECT_EQ(hopper_sched_for(automatic, 1024), kHopperSchedPingpong);  // 16 x 1024
  EXPECT_EQ(hopper_sched_for(automatic, 1025), kHopperSchedTurns);
  EXPECT_EQ(hopper_sched_for(automatic, 2048), kHopperSchedTurns);  // 8 x 2048
  EXPECT_EQ(hopper_sched_for(automatic, 4096), kHopperSchedTurns);  // 8 x (q 512, kv 4096)
  EXPECT_EQ(hopper_sched_for(automatic, 8192), kHopperSchedTurns);  // 1 x 8192
  EXPECT_EQ(hopper_sched_for(automatic, 0), kHopperSchedPingpong);
}

TEST(HopperSchedule, ASettingWins) {
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(hopper_sched_for(s, 16), s);
    EXPECT_EQ(hopper_sched_for(s, 1 << 20), s);
  }
  // Anything outside 0..3 is the per-call rule.
  EXPECT_EQ(hopper_sched_for(7, 100), kHopperSchedPingpong);
  EXPECT_EQ(hopper_sched_for(-1, 100000), kHopperSchedTurns);
}

}  // namespace
}  // namespace kvattn::ops::cuda_impl::k
