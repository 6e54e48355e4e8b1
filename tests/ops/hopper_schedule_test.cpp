// The wgmma prefill's consumer schedule rule (hopper_sched_for, src/ops/cuda/routing.h): host
// arithmetic only, so it is checked on every build.
#include <gtest/gtest.h>

#include "ops/cuda/routing.h"

namespace kvattn::ops::cuda_impl::k {
namespace {

TEST(HopperSchedule, AutomaticIsPingpongAndTurnsForFp8Pages) {
  const int automatic = KernelRouting{}.hopper_sched;
  EXPECT_EQ(automatic, -1);  // the library's default: no schedule named
  EXPECT_EQ(hopper_sched_for(automatic, false), kHopperSchedPingpong);
  EXPECT_EQ(hopper_sched_for(automatic, true), kHopperSchedTurns);
}

TEST(HopperSchedule, ASettingWins) {
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(hopper_sched_for(s, false), s);
    EXPECT_EQ(hopper_sched_for(s, true), s);
  }
  // Anything outside 0..3 is the default.
  EXPECT_EQ(hopper_sched_for(7, false), kHopperSchedPingpong);
  EXPECT_EQ(hopper_sched_for(-2, true), kHopperSchedTurns);
}

}  // namespace
}  // namespace kvattn::ops::cuda_impl::k
