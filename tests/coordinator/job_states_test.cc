#include "coordinator/job_states.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"
#include "proto/protocol.h"

namespace conveyor::coordinator {
namespace {

// The whole table, cell by cell: the allowed moves are exactly these.
TEST(JobStatesTest, AllowsExactlyTheDocumentedMoves) {
  const std::set<std::pair<v1::JobState, v1::JobState>> allowed = {
      {v1::QUEUED, v1::PLANNING},    {v1::QUEUED, v1::FAILED},
      {v1::QUEUED, v1::CANCELLED},   {v1::PLANNING, v1::RUNNING},
      {v1::PLANNING, v1::QUEUED},    {v1::PLANNING, v1::FAILED},
      {v1::PLANNING, v1::CANCELLED}, {v1::RUNNING, v1::SUCCEEDED},
      {v1::RUNNING, v1::QUEUED},     {v1::RUNNING, v1::FAILED},
      {v1::RUNNING, v1::CANCELLED},
  };
  for (int f = v1::JobState_MIN; f <= v1::JobState_MAX; ++f) {
    for (int t = v1::JobState_MIN; t <= v1::JobState_MAX; ++t) {
      const auto from = static_cast<v1::JobState>(f);
      const auto to = static_cast<v1::JobState>(t);
      EXPECT_EQ(CanMoveJob(from, to), allowed.contains({from, to}))
          << proto::JobStateName(from) << " -> " << proto::JobStateName(to);
    }
  }
}

TEST(JobStatesTest, FinalStatesAreFinal) {
  for (v1::JobState end : {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    ASSERT_TRUE(proto::IsTerminal(end));
    for (int t = v1::JobState_MIN; t <= v1::JobState_MAX; ++t) {
      EXPECT_FALSE(CanMoveJob(end, static_cast<v1::JobState>(t)));
    }
  }
}

}  // namespace
}  // namespace conveyor::coordinator
