#include "gtest/gtest.h"
#include "transport/nccl/internal/poll_pacer.h"

namespace conveyor::transport::p2p_internal {
namespace {

TEST(PollPacerTest, BacksOffWhileNothingCompletesAndResetsOnProgress) {
  PollPacer pacer;
  EXPECT_EQ(pacer.Next(/*in_flight=*/true, false), absl::Microseconds(20));
  EXPECT_EQ(pacer.Next(true, false), absl::Microseconds(40));
  for (int i = 0; i < 10; ++i) pacer.Next(true, false);
  EXPECT_EQ(pacer.Next(true, false), PollPacer::kMaxPoll);
  pacer.Progressed();
  EXPECT_EQ(pacer.Next(true, false), PollPacer::kMinPoll);
  EXPECT_EQ(pacer.Next(true, false), absl::Microseconds(20));
}

TEST(PollPacerTest, WithoutGroupsInFlightChecksStallsOrIdles) {
  PollPacer pacer;
  EXPECT_EQ(pacer.Next(false, /*waiting=*/true), PollPacer::kStallCheck);
  EXPECT_EQ(pacer.Next(false, false), PollPacer::kIdleCheck);
}

}  // namespace
}  // namespace conveyor::transport::p2p_internal
