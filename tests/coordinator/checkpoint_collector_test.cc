#include "coordinator/checkpoint_collector.h"

#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Key;

google::protobuf::RepeatedPtrField<v1::StageFile> Files(
    std::initializer_list<int> stages) {
  google::protobuf::RepeatedPtrField<v1::StageFile> files;
  for (int s : stages) {
    v1::StageFile* f = files.Add();
    f->set_stage(s);
    f->set_file("stage-" + std::to_string(s) + ".safetensors");
    f->set_bytes(100 + s);
    f->set_crc32c(7 * s);
  }
  return files;
}

// Four stages on two ranks, interleaved: rank 0 holds 0 and 2, rank 1
// holds 1 and 3; steps 5..10 (resumed from step 4).
CheckpointCollector Interleaved() {
  CheckpointCollector c;
  c.Start({0, 1, 0, 1}, /*first_step=*/4, /*last_step=*/10);
  return c;
}

TEST(CheckpointCollectorTest, AStepIsCompleteOnceEveryStageIsIn) {
  CheckpointCollector c = Interleaved();
  auto r = c.Add(1, 6, Files({1, 3}));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(c.pending_steps(), 1);
  r = c.Add(0, 6, Files({0, 2}));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->has_value());
  EXPECT_THAT(**r, ElementsAre(Key(0), Key(1), Key(2), Key(3)));
  EXPECT_EQ((**r).at(3).bytes(), 103u);
  EXPECT_EQ(c.pending_steps(), 0);  // Forgotten once handed out.
}

TEST(CheckpointCollectorTest, StepsCompleteIndependentlyInAnyOrder) {
  CheckpointCollector c = Interleaved();
  ASSERT_TRUE(c.Add(0, 8, Files({0, 2})).ok());
  ASSERT_TRUE(c.Add(0, 10, Files({0, 2})).ok());
  auto r = c.Add(1, 10, Files({1, 3}));
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ(c.pending_steps(), 1);  // Step 8 still waits for rank 1.
  r = c.Add(1, 8, Files({1, 3}));
  ASSERT_TRUE(r.ok() && r->has_value());
}

TEST(CheckpointCollectorTest, ARankCannotReportAStageItDoesNotHold) {
  CheckpointCollector c = Interleaved();
  // Rank 0 reporting stage 1 would stand in for rank 1's missing file.
  auto r = c.Add(0, 6, Files({0, 1, 2, 3}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("checkpoint file for stage 1, which it does not hold"));
  for (int bad : {-1, 4}) {
    EXPECT_FALSE(c.Add(1, 6, Files({bad})).ok()) << bad;
  }
  // Nothing of a refused report was filed: rank 0's good files alone do
  // not complete the step with rank 1's still missing.
  EXPECT_EQ(c.pending_steps(), 0);
  auto ok = c.Add(0, 6, Files({0, 2}));
  ASSERT_TRUE(ok.ok());
  EXPECT_FALSE(ok->has_value());
}

TEST(CheckpointCollectorTest, IgnoresStepsOutsideTheAttempt) {
  CheckpointCollector c = Interleaved();
  for (int64_t step : {0, 3, 4, 11}) {
    auto r = c.Add(0, step, Files({0, 2}));
    ASSERT_TRUE(r.ok()) << step;
    EXPECT_FALSE(r->has_value()) << step;
  }
  EXPECT_EQ(c.pending_steps(), 0);
}

TEST(CheckpointCollectorTest, StopAndStartForgetTheEarlierAttempt) {
  CheckpointCollector c = Interleaved();
  ASSERT_TRUE(c.Add(0, 6, Files({0, 2})).ok());
  c.Stop();
  EXPECT_EQ(c.pending_steps(), 0);
  // A late report of the attempt that ended.
  auto late = c.Add(1, 6, Files({1, 3}));
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->has_value());
  // The next attempt: two stages, both on rank 0, from step 6.
  c.Start({0, 0}, 6, 10);
  ASSERT_TRUE(c.Add(0, 6, Files({0, 1})).ok());  // At the resume step.
  EXPECT_EQ(c.pending_steps(), 0);
  auto r = c.Add(0, 7, Files({0, 1}));
  ASSERT_TRUE(r.ok() && r->has_value());
}

}  // namespace
}  // namespace conveyor::coordinator
