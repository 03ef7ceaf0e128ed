#include "job/planner.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::job {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A 4-stage MLP job with the given pipeline section.
// With `marked` false the same 8 layers come without boundary markers.
JobSpec Job(const std::string& pipeline, int microbatches = 4, int stages = 4,
            bool marked = true) {
  std::string layers;
  for (int s = 0; s < stages; ++s) {
    if (s > 0 && marked) layers += "    - boundary\n";
    layers += "    - dense: {features: 8}\n    - relu\n";
  }
  const std::string yaml = absl::StrCat(
      "model:\n  input_shape: [4]\n  init: {seed: 1}\n  layers:\n", layers,
      "  loss: mse\n"
      "data: {source: synthetic-regression}\n"
      "training: {steps: 2, batch_size: 8, microbatches: ",
      microbatches, "}\noptimizer: {kind: sgd, lr: 0.1}\npipeline: ", pipeline,
      "\n");
  absl::StatusOr<JobSpec> job = ParseJobSpec(yaml, "job.yaml");
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

// Elastic restarts lay a job out on fewer workers: marked stages merged in
// order (the first groups one stage larger), V kept; auto stages searched
// anew for the new count; too few stages or layers refused.
TEST(PlannerTest, RelayoutOntoFewerWorkers) {
  auto cut = [](const JobSpec& job, int ranks) {
    absl::StatusOr<JobSpec> spec = RelayoutOnto(job, ranks);
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<JobPlan> plan = PlanJob(*std::move(spec));
    EXPECT_TRUE(plan.ok()) << plan.status();
    std::vector<int> begin;
    for (const StagePlan& s : plan->stages) begin.push_back(s.first_layer);
    EXPECT_EQ(plan->num_ranks, ranks);
    return begin;
  };
  // Four marked stages at layers 0, 2, 4, 6.
  EXPECT_THAT(cut(Job("{schedule: 1f1b}"), 3), ElementsAre(0, 4, 6));
  EXPECT_THAT(cut(Job("{schedule: 1f1b}"), 2), ElementsAre(0, 4));
  EXPECT_THAT(cut(Job("{schedule: 1f1b}"), 1), ElementsAre(0));
  EXPECT_THAT(cut(Job("{schedule: 1f1b}"), 4), ElementsAre(0, 2, 4, 6));
  // Eight marked stages, V = 2 on 4 ranks, onto 2 ranks: 4 stages.
  EXPECT_THAT(
      cut(Job("{schedule: interleaved-1f1b, virtual_stages: 2}", 4, 8), 2),
      ElementsAre(0, 4, 8, 12));
  // Onto 3 it cuts (6 stages), but the schedule then cannot plan M = 4 on
  // P = 3: FailOrRestart tries fewer workers.
  absl::StatusOr<JobSpec> three = RelayoutOnto(
      Job("{schedule: interleaved-1f1b, virtual_stages: 2}", 4, 8), 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->model.num_stages, 6);
  EXPECT_FALSE(PlanJob(*three).ok());
  // stages: auto searches 2 stages instead of 4.
  absl::StatusOr<JobSpec> automatic = RelayoutOnto(
      Job("{schedule: 1f1b, stages: auto, num_stages: 4}", 4, 4, false), 2);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->pipeline.num_stages, 2);
  // Too few stages for the workers.
  absl::StatusOr<JobSpec> more =
      RelayoutOnto(Job("{schedule: interleaved-1f1b, virtual_stages: 2}"), 3);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(more.status().message(),
              HasSubstr("3 workers x 2 virtual stages need 6 stages; the "
                        "job's boundary markers make 4"));
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

TEST(PlannerTest, ZeroBubbleVPlacesStagesInAVAndDefaultsToTwoARank) {
  absl::StatusOr<JobPlan> plan = PlanJob(Job("{schedule: zb-v}"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_ranks, 2);
  EXPECT_EQ(plan->virtual_stages, 2);
  EXPECT_EQ(plan->schedule.placement, scheduler::Placement::kV);
  // Rank 0 holds the first and the last stage.
  std::vector<int> ranks;
  for (const StagePlan& s : plan->stages) ranks.push_back(s.rank);
  EXPECT_THAT(ranks, ElementsAre(0, 1, 1, 0));
  absl::Status s = PlanJob(Job("{schedule: zb-v, virtual_stages: 1}")).status();
  EXPECT_THAT(s.message(), HasSubstr("job.yaml:"));
  EXPECT_THAT(s.message(), HasSubstr("zb-v holds two stages a rank (V = 2"));
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

// Stages: auto.

// One profile entry per layer: forward f ms, backward 2f ms (BI = BW = f).
std::vector<engine::LayerProfile> Profile(const std::vector<double>& f_ms) {
  std::vector<engine::LayerProfile> out;
  for (double f : f_ms) {
    out.push_back({.forward_seconds = f * 1e-3,
                   .backward_input_seconds = f * 1e-3,
                   .backward_weight_seconds = f * 1e-3,
                   .activation_bytes = 1000,
                   .parameter_bytes = 100});
  }
  return out;
}

// An evaluation too large to schedule on the job's ranks (P*V*K*M beyond
// the schedule library's bound) fails at the eval section, naming the
// counts.
TEST(PlannerTest, RejectsAnEvaluationTooLargeToScheduleAtItsSection) {
  std::string layers;
  for (int s = 0; s < 64; ++s) {
    if (s > 0) layers += "    - boundary\n";
    layers += "    - dense: {features: 2}\n";
  }
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      absl::StrCat("model:\n  input_shape: [2]\n  init: {seed: 1}\n"
                   "  layers:\n",
                   layers,
                   "  loss: mse\n"
                   "data: {source: synthetic-regression}\n"
                   "training: {steps: 1, batch_size: 1024, microbatches: "
                   "1024}\n"
                   "optimizer: {kind: sgd, lr: 0.1}\n"
                   "eval: {batches: 1024, data: {source: "
                   "synthetic-regression}}\n"),
      "big.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::Status s = PlanJob(*std::move(spec)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("big.yaml:136:7: eval: the evaluation's 1048576 "
                        "microbatches (batches * training.microbatches) "
                        "cannot be scheduled on 64 worker(s): P*V*M = "
                        "67108864 stage-microbatches is too large"));
}

TEST(PlannerTest, AutoStagesStartWithAProvisionalEvenCut) {
  // 8 layers (dense, relu x 4) without markers, cut into 4.
  absl::StatusOr<JobPlan> plan = PlanJob(
      Job("{schedule: 1f1b, stages: auto, num_stages: 4}", 4, 4, false));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(NeedsProfile(*plan));
  EXPECT_EQ(plan->num_ranks, 4);
  ASSERT_EQ(plan->stages.size(), 4u);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(plan->stages[s].first_layer, 2 * s);
    EXPECT_EQ(plan->stages[s].num_layers, 2);
  }
  EXPECT_THAT(plan->marker_cut.first_layers(), ElementsAre(0));
  EXPECT_THAT(DescribePlan(*plan), HasSubstr("provisional"));
}

TEST(PlannerTest, AutoStagesKeepTheMarkersInTheProvisionalCut) {
  // Markers after layers 1, 3, 5 (4 marked stages of 2 layers); 6 stages:
  // two marked stages are split once more.
  absl::StatusOr<JobPlan> plan =
      PlanJob(Job("{schedule: 1f1b, stages: auto, num_stages: 6}"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->marker_cut.first_layers(), ElementsAre(0, 2, 4, 6));
  std::vector<int> begin;
  for (const StagePlan& s : plan->stages) begin.push_back(s.first_layer);
  EXPECT_THAT(begin, ElementsAre(0, 1, 2, 3, 4, 6));
}

TEST(PlannerTest, AutoStagesRejectStageCountsTheModelCannotHave) {
  absl::Status more =
      PlanJob(Job("{schedule: 1f1b, stages: auto, num_stages: 9}", 4, 4, false))
          .status();
  EXPECT_EQ(more.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(more.message(),
              HasSubstr("job.yaml:17:54: pipeline.num_stages: 9 stages need "
                        "at least 9 layers; the model has 8"));
  absl::Status fewer =
      PlanJob(Job("{schedule: 1f1b, stages: auto, num_stages: 3}")).status();
  EXPECT_THAT(fewer.message(),
              HasSubstr("3 is fewer than the 4 stages the model's boundary "
                        "markers make"));
  absl::Status virtual_stages =
      PlanJob(Job("{schedule: interleaved-1f1b, virtual_stages: 2, stages: "
                  "auto, num_stages: 5}",
                  4, 4, false))
          .status();
  EXPECT_THAT(virtual_stages.message(),
              HasSubstr("not a multiple of virtual_stages = 2"));
}

TEST(PlannerTest, ChooseStagesBalancesAnUnevenProfile) {
  absl::StatusOr<JobPlan> plan = PlanJob(
      Job("{schedule: 1f1b, stages: auto, num_stages: 4}", 8, 4, false));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Layers 0-3 cost 1 ms each, 4-5 cost 2, 6-7 cost 4: the even cut (2 per
  // stage) puts 8 ms on the last stage; the best puts 6, 2, 4, 4 ... ms.
  absl::StatusOr<JobPlan> chosen =
      ChooseStages(*plan, Profile({1, 1, 1, 1, 2, 2, 4, 4}), "cpu:1", false);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_TRUE(chosen->auto_split.has_value());
  EXPECT_FALSE(NeedsProfile(*chosen));
  std::vector<int> begin;
  for (const StagePlan& s : chosen->stages) begin.push_back(s.first_layer);
  EXPECT_THAT(begin, ElementsAre(0, 4, 6, 7));
  EXPECT_EQ(chosen->job.model.num_stages, 4);
  EXPECT_EQ(chosen->job.model.layers[6].stage, 2);
  const scheduler::StageSearchResult& r = chosen->auto_split->search;
  ASSERT_TRUE(r.even_makespan.has_value());
  EXPECT_LT(r.makespan, *r.even_makespan * 0.8);
  // Parameters are re-assigned to the chosen stages.
  EXPECT_THAT(chosen->stages[2].parameter_names,
              ElementsAre("layers.6.weight", "layers.6.bias"));
  const std::string text = DescribePlan(*chosen);
  EXPECT_THAT(text, HasSubstr("stages: auto from a profile on cpu:1"));
  EXPECT_THAT(text, HasSubstr("even split (2,2,2,2 layers)"));
  EXPECT_THAT(text, HasSubstr("as fast"));
}

TEST(PlannerTest, ChooseStagesChargesOptimizerStateAndMeetsTheBudget) {
  // sgd without momentum holds parameters and gradients: 2 x 100 bytes per
  // layer, plus 1000 activation bytes per microbatch in flight.
  absl::StatusOr<JobPlan> plan = PlanJob(
      Job("{schedule: 1f1b, stages: auto, num_stages: 2, memory_budget: 1}", 4,
          4, false));
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<scheduler::StageSearchInput> input =
      StageSearchInputFor(*plan, Profile({1, 1, 1, 1, 1, 1, 1, 1}));
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->layers[0].state_bytes, 200);
  EXPECT_EQ(input->memory_budget, 1);
  absl::Status too_small =
      ChooseStages(*plan, Profile({1, 1, 1, 1, 1, 1, 1, 1}), "cpu:1", false)
          .status();
  EXPECT_EQ(too_small.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_small.message(), HasSubstr("memory_budget"));
  absl::Status wrong_length =
      ChooseStages(*plan, Profile({1, 1}), "cpu:1", false).status();
  EXPECT_THAT(wrong_length.message(),
              HasSubstr("the layer profile has 2 entries; the model has 8"));
}

TEST(PlannerTest, ScheduleAutoChoosesTheShortestPredictedStepAndSaysWhy) {
  absl::StatusOr<JobPlan> plan =
      PlanJob(Job("{schedule: auto, stages: auto, workers: 2}", 8, 4, false));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(NeedsProfile(*plan));
  EXPECT_EQ(plan->num_ranks, 2);  // Provisionally one stage a worker.
  const std::vector<engine::LayerProfile> profile =
      Profile({1, 1, 1, 1, 2, 2, 4, 4});
  absl::StatusOr<JobPlan> chosen = ChooseStages(*plan, profile, "cpu:1", false);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_TRUE(chosen->auto_split.has_value());
  const std::vector<ScheduleCandidate>& candidates =
      chosen->auto_split->candidates;
  // Every kind but looped-bfs (gpipe's order), with V in {1, 2, 4} where it
  // takes virtual stages and 2 for zb-v and dualpipev: 15.
  ASSERT_EQ(candidates.size(), 15u);
  EXPECT_EQ(chosen->num_ranks, 2);
  EXPECT_EQ(chosen->num_stages, 2 * chosen->virtual_stages);
  // The winner's predicted step is the smallest; each candidate's is what a
  // stages: auto job of that schedule and V would be predicted.
  int searched = 0;
  for (const ScheduleCandidate& c : candidates) {
    ASSERT_TRUE(c.search.has_value()) << c.schedule << ": " << c.refused;
    ++searched;
    // Within 1e-9 counts as a tie, which the kind listed first wins.
    EXPECT_GE(c.search->makespan * (1 + 1e-9),
              chosen->auto_split->search.makespan)
        << c.schedule << " V=" << c.virtual_stages;
    absl::StatusOr<JobPlan> alone = PlanJob(Job(
        absl::StrCat("{schedule: ", c.schedule,
                     ", virtual_stages: ", c.virtual_stages,
                     ", stages: auto, num_stages: ", 2 * c.virtual_stages, "}"),
        8, 4, false));
    ASSERT_TRUE(alone.ok()) << alone.status();
    absl::StatusOr<JobPlan> alone_chosen =
        ChooseStages(*alone, profile, "cpu:1", false);
    ASSERT_TRUE(alone_chosen.ok()) << alone_chosen.status();
    EXPECT_EQ(alone_chosen->auto_split->search.makespan, c.search->makespan)
        << c.schedule << " V=" << c.virtual_stages;
  }
  EXPECT_EQ(searched, 15);
  const std::string text = DescribePlan(*chosen);
  EXPECT_THAT(text, HasSubstr("schedule: auto considered 15 candidate(s)"));
  EXPECT_THAT(text, HasSubstr("<- chosen"));
  EXPECT_THAT(ScheduleChoice(*chosen),
              HasSubstr(absl::StrCat(chosen->job.pipeline.schedule,
                                     " V=", chosen->virtual_stages,
                                     " of 15 candidates: the shortest "
                                     "predicted step")));
}

// The transfer latency a worker measures with its profile is charged to
// every simulated transfer: each candidate's predicted step is what the
// simulator gives its schedule and cut with that latency, so it grows with
// it, and a schedule with more transfers on its critical path (V = 4 moves
// each microbatch between ranks four times as often) loses more.
TEST(PlannerTest, ScheduleAutoChargesTheTransferLatency) {
  absl::StatusOr<JobPlan> plan =
      PlanJob(Job("{schedule: auto, stages: auto, workers: 2}", 8, 4, false));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<engine::LayerProfile> profile =
      Profile({1, 1, 1, 1, 1, 1, 1, 1});
  absl::StatusOr<JobPlan> free = ChooseStages(*plan, profile, "cpu", false);
  absl::StatusOr<JobPlan> slow =
      ChooseStages(*plan, profile, "cpu", false, /*transfer_seconds=*/0.5);
  ASSERT_TRUE(free.ok() && slow.ok());
  std::map<std::string, double> growth;
  for (size_t i = 0; i < free->auto_split->candidates.size(); ++i) {
    const ScheduleCandidate& a = free->auto_split->candidates[i];
    const ScheduleCandidate& b = slow->auto_split->candidates[i];
    ASSERT_TRUE(a.search.has_value() && b.search.has_value());
    EXPECT_GT(b.search->makespan, a.search->makespan) << a.schedule;
    growth[absl::StrCat(a.schedule, "/", a.virtual_stages)] =
        b.search->makespan - a.search->makespan;
  }
  EXPECT_GT(growth.at("interleaved-1f1b/4"), growth.at("interleaved-1f1b/1"));
  EXPECT_GT(slow->auto_split->search.makespan,
            free->auto_split->search.makespan);
}

TEST(PlannerTest, ScheduleAutoSaysWhyACandidateCannotRunAndWhatNoneFits) {
  // 4 microbatches on 2 workers: dualpipev needs 2P = 4, fine; on 4
  // workers it needs 8, and V = 4 needs 16 stages of 8 layers.
  absl::StatusOr<JobPlan> plan =
      PlanJob(Job("{schedule: auto, stages: auto, workers: 4}", 4, 4, false));
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<JobPlan> chosen =
      ChooseStages(*plan, Profile({1, 1, 1, 1, 1, 1, 1, 1}), "cpu:1", false);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  const std::string text = DescribePlan(*chosen);
  EXPECT_THAT(text, HasSubstr("dualpipev          2   not possible: dualpipev "
                              "needs at least as many microbatches as "
                              "stages, 2P = 8"));
  EXPECT_THAT(text, HasSubstr("16 stages need at least 16 layers"));
  // More workers than layers is refused at submission, at `workers`.
  absl::Status wide =
      PlanJob(Job("{schedule: auto, stages: auto, workers: 9}", 4, 4, false))
          .status();
  EXPECT_THAT(wide.message(),
              HasSubstr("pipeline.workers: 9 stages need at least 9 layers"));
  // A budget nothing fits names the smallest peak any candidate needs.
  absl::StatusOr<JobPlan> tight = PlanJob(
      Job("{schedule: auto, stages: auto, workers: 2, memory_budget: 1}", 8, 4,
          false));
  ASSERT_TRUE(tight.ok()) << tight.status();
  absl::Status none =
      ChooseStages(*tight, Profile({1, 1, 1, 1, 1, 1, 1, 1}), "cpu:1", false)
          .status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(),
              HasSubstr("pipeline.memory_budget: no schedule fits 1 B per "
                        "device on 2 worker(s); the smallest peak any "
                        "candidate needs is "));
}

TEST(PlannerTest, ChooseStagesKeepsTheMarkers) {
  // Markers after layers 1, 3, 5; 5 stages: one marked stage is split.
  absl::StatusOr<JobPlan> plan =
      PlanJob(Job("{schedule: 1f1b, stages: auto, num_stages: 5}"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<JobPlan> chosen =
      ChooseStages(*plan, Profile({1, 1, 1, 1, 1, 1, 8, 8}), "cpu:1", false);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  std::vector<int> begin;
  for (const StagePlan& s : chosen->stages) begin.push_back(s.first_layer);
  // The two 8 ms layers get a stage each; the markers at 2, 4, 6 stay.
  EXPECT_THAT(begin, ElementsAre(0, 2, 4, 6, 7));
}

}  // namespace
}  // namespace conveyor::job
