#include "checkpoint/layout.h"

#include "gtest/gtest.h"

namespace conveyor::checkpoint {
namespace {

TEST(LayoutTest, SpellsTheLayout) {
  EXPECT_EQ(StepDirPath("/ckpt", 12), "/ckpt/step-12");
  EXPECT_EQ(StageFileName(3), "stage-3.safetensors");
  EXPECT_EQ(StageFilePath("/ckpt/", 12, 3),
            "/ckpt/step-12/stage-3.safetensors");
}

TEST(LayoutTest, ReadsOnlyCanonicalStepDirectoryNames) {
  EXPECT_EQ(StepOfDirName("step-0"), 0);
  EXPECT_EQ(StepOfDirName("step-12"), 12);
  EXPECT_EQ(StepOfDirName("step-9223372036854775807"), INT64_MAX);
  for (const char* name :
       {"step-", "step-01", "step--1", "step-+1", "step-x", "step-1.tmp",
        "step-9223372036854775808", "step-99999999999999999999", "stage-1",
        "Step-1", ""}) {
    EXPECT_EQ(StepOfDirName(name), std::nullopt) << name;
  }
  // What StepDirPath writes, StepOfDirName reads.
  EXPECT_EQ(StepOfDirName("step-" + std::to_string(int64_t{1} << 40)),
            int64_t{1} << 40);
}

}  // namespace
}  // namespace conveyor::checkpoint
