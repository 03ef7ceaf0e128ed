#include "coordinator/planner.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A 4-stage MLP job with the given pipeline section.
engine::JobSpec Job(const std::string& pipeline, int microbatches = 4,
                    int stages = 4) {
  std::string layers;
  for (int s = 0; s < stages; ++s) {
    if (s > 0) layers += "    - boundary\n";
    layers += "    - dense: {features: 8}\n    - relu\n";
  }
  const std::string yaml = absl::StrCat(
      "model:\n  input_shape: [4]\n  init: {seed: 1}\n  layers:\n", layers,
      "  loss: mse\n"
      "data: {source: synthetic-regression}\n"
      "training: {steps: 2, batch_size: 8, microbatches: ",
      microbatches, "}\noptimizer: {kind: sgd, lr: 0.1}\npipeline: ", pipeline,
      "\n");
  absl::StatusOr<engine::JobSpec> job = engine::ParseJobSpec(yaml, "job.yaml");
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

TEST(PlannerTest, PlacesStageSOnRankSModP) {
  absl::StatusOr<JobPlan> plan =
      PlanJob(Job("{schedule: interleaved-1f1b, virtual_stages: 2}"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_ranks, 2);
  EXPECT_EQ(plan->num_stages, 4);
  ASSERT_EQ(plan->stages.size(), 4u);
  EXPECT_EQ(plan->stages[3].rank, 1);
  EXPECT_EQ(plan->stages[2].first_layer, 4);
  EXPECT_EQ(plan->stages[2].num_layers, 2);
  EXPECT_THAT(plan->stages[1].parameter_names,
              ElementsAre("layers.2.weight", "layers.2.bias"));
  EXPECT_EQ(plan->stages[0].num_params, 4 * 8 + 8);
  std::vector<const StagePlan*> rank1 = StagesOfRank(*plan, 1);
  ASSERT_EQ(rank1.size(), 2u);
  EXPECT_EQ(rank1[0]->stage, 1);
  EXPECT_EQ(rank1[1]->stage, 3);
  EXPECT_EQ(plan->schedule.actions.size(), 2u);
  // Every (stage, microbatch) has a forward and a backward: 2 * 4 * 4.
  EXPECT_EQ(plan->schedule.TotalActions(), 32u);
  EXPECT_THAT(DescribePlan(*plan), HasSubstr("interleaved-1f1b, 2 worker(s)"));
}

TEST(PlannerTest, RejectsUnknownScheduleAtItsPosition) {
  absl::Status s = PlanJob(Job("{schedule: 2f2b}")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("job.yaml:"));
  EXPECT_THAT(s.message(), HasSubstr("gpipe, 1f1b"));
}

TEST(PlannerTest, RejectsStagesNotAMultipleOfVirtualStages) {
  absl::Status s =
      PlanJob(Job("{schedule: interleaved-1f1b, virtual_stages: 3}")).status();
  EXPECT_THAT(s.message(), HasSubstr("not a multiple of virtual_stages = 3"));
}

TEST(PlannerTest, RejectsVirtualStagesForOneF1B) {
  absl::Status s = PlanJob(Job("{schedule: 1f1b, virtual_stages: 2}")).status();
  EXPECT_THAT(s.message(), HasSubstr("takes no virtual stages"));
}

TEST(PlannerTest, RejectsMicrobatchesTheScheduleCannotSplit) {
  // Interleaved with V > 1 needs M % P == 0: 2 workers, 3 microbatches.
  absl::Status s =
      PlanJob(Job("{schedule: interleaved-1f1b, virtual_stages: 2}", 1))
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("P = 2 workers, M = 1 microbatches"));
}

}  // namespace
}  // namespace conveyor::coordinator
