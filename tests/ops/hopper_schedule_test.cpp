// The wgmma prefill's consumer schedule rule (hopper_sched_for, src/ops/cuda/routing.h): host
// arithmetic only, so it is checked on every build.
#include <gtest/gtest.h>

#include "ops/cuda/routing.h"

namespace kvattn::ops::cuda_impl::k {
namespace {

TEST(HopperSchedule, AutomaticIsPingpong) {
  const int automatic = KernelRouting{}.hopper_sched;
  EXPECT_EQ(automatic, -1);  // the library's default: no schedule named
  EXPECT_EQ(hopper_sched_for(automatic), kHopperSchedPingpong);
  EXPECT_EQ(kHopperSchedPingpong, 2);  // the index KVATTN_PREFILL_HOPPER_SCHED=pingpong sets
}

TEST(HopperSchedule, ASettingWins) {
  for (int s = 0; s < 4; ++s) EXPECT_EQ(hopper_sched_for(s), s);
  // Anything outside 0..3 is the default.
  EXPECT_EQ(hopper_sched_for(7), kHopperSchedPingpong);
  EXPECT_EQ(hopper_sched_for(-2), kHopperSchedPingpong);
}

}  // namespace
}  // namespace kvattn::ops::cuda_impl::k
