#include "job/rank_program.h"

#include <fstream>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/yaml_load_count.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/protocol.h"

namespace conveyor::job {
namespace {

using ::testing::HasSubstr;

// A 4-stage MLP job; `pipeline` is its pipeline section.
std::string Yaml(const std::string& pipeline) {
  std::string layers;
  for (int s = 0; s < 4; ++s) {
    if (s > 0) layers += "    - boundary\n";
    layers += "    - dense: {features: 8}\n    - relu\n";
  }
  return absl::StrCat(
      "model:\n  input_shape: [4]\n  init: {seed: 1}\n  layers:\n", layers,
      "  loss: mse\n"
      "data: {source: synthetic-regression}\n"
      "training: {steps: 3, batch_size: 8, microbatches: 4}\n"
      "optimizer: {kind: sgd, lr: 0.1}\npipeline: ",
      pipeline, "\n");
}

JobPlan Plan(const std::string& yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobPlan> plan = PlanJob(*std::move(spec));
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

ProgramContext Context(const std::string& yaml) {
  return {.job_id = "job-3",
          .job_number = (uint64_t{3} << 16) | 1,
          .secret = "s3cret",
          .yaml = yaml,
          .file_name = "job.yaml",
          .recv_timeout_ms = 5000};
}

// What a manifest of `stages` stages lists, as the coordinator passes it.
std::vector<v1::StageFile> StageFiles(int stages) {
  std::vector<v1::StageFile> files;
  for (int s = 0; s < stages; ++s) {
    v1::StageFile& f = files.emplace_back();
    f.set_stage(s);
    f.set_file(absl::StrCat("stage-", s, ".safetensors"));
  }
  return files;
}

TEST(RankProgramTest, CompilesARanksStagesActionsAndCut) {
  const std::string yaml =
      Yaml("{schedule: interleaved-1f1b, virtual_stages: 2}");
  const JobPlan plan = Plan(yaml);
  const v1::JobProgram program = CompileRankProgram(plan, 1, Context(yaml));
  EXPECT_EQ(program.job_id(), "job-3");
  EXPECT_EQ(program.job_number(), (uint64_t{3} << 16) | 1);
  EXPECT_EQ(program.rank(), 1);
  EXPECT_EQ(program.num_ranks(), 2);
  EXPECT_EQ(program.num_stages(), 4);
  EXPECT_EQ(program.steps(), 3);
  EXPECT_EQ(program.recv_timeout_ms(), 5000);
  ASSERT_EQ(program.stages_size(), 2);
  EXPECT_EQ(program.stages(0).stage(), 1);
  EXPECT_EQ(program.stages(1).stage(), 3);
  EXPECT_EQ(program.stages(1).first_layer(), 6);
  EXPECT_EQ(program.stages(1).num_layers(), 2);
  EXPECT_EQ(program.stages(1).parameter_names_size(), 2);
  EXPECT_THAT(program.stage_begin(), ::testing::ElementsAre(0, 2, 4, 6));
  auto actions = proto::ActionsFromProto(program.actions(), 4);
  ASSERT_TRUE(actions.ok()) << actions.status();
  EXPECT_EQ(*actions, plan.schedule.actions[1]);
  EXPECT_EQ(program.resume_step(), 0);
  EXPECT_EQ(program.resume_files_size(), 0);
}

TEST(RankProgramTest, SendsEachRankOnlyItsStagesResumeFiles) {
  const std::string yaml = Yaml("{schedule: 1f1b}");
  const JobPlan plan = Plan(yaml);
  ProgramContext context = Context(yaml);
  context.resume_step = 2;
  context.resume_dir = "/ckpt/step-2";
  context.resume_files = StageFiles(4);
  const v1::JobProgram program = CompileRankProgram(plan, 2, context);
  EXPECT_EQ(program.resume_step(), 2);
  EXPECT_EQ(program.resume_dir(), "/ckpt/step-2");
  ASSERT_EQ(program.resume_files_size(), 1);
  EXPECT_EQ(program.resume_files(0).stage(), 2);
}

// Resumed from a checkpoint cut otherwise, each rank gets the files that
// hold its parameters: parts of one file, or several files.
TEST(RankProgramTest, SendsTheFilesHoldingARanksParametersWhateverTheCut) {
  const std::string yaml = Yaml("{schedule: 1f1b}");  // Stages at 0, 2, 4, 6.
  const JobPlan plan = Plan(yaml);
  // Two stages of four layers each.
  EXPECT_EQ(CheckpointStagesOf(plan, 0, {0, 4}), (std::set<int>{0}));
  EXPECT_EQ(CheckpointStagesOf(plan, 1, {0, 4}), (std::set<int>{0}));
  EXPECT_EQ(CheckpointStagesOf(plan, 3, {0, 4}), (std::set<int>{1}));
  // Eight one-layer stages: a relu's stage has no parameters, no file.
  EXPECT_EQ(CheckpointStagesOf(plan, 1, {0, 1, 2, 3, 4, 5, 6, 7}),
            (std::set<int>{2}));
  // Cut where the plan is: the rank's own stage.
  EXPECT_EQ(CheckpointStagesOf(plan, 2, {}), (std::set<int>{2}));

  // Into two stages from the four-stage checkpoint.
  // Boundaries at layers 2 and 6 go: stages at 0 and 4.
  const std::string two = absl::StrReplaceAll(
      yaml, {{"    - relu\n    - boundary\n    - dense: {features: 8}\n    - "
              "relu\n    - boundary\n    - dense: {features: 8}\n    - "
              "relu\n    - boundary\n",
              "    - relu\n    - dense: {features: 8}\n    - relu\n    - "
              "boundary\n    - dense: {features: 8}\n    - relu\n"}});
  const JobPlan halves = Plan(two);
  ASSERT_EQ(halves.num_stages, 2);
  ASSERT_EQ(halves.stages[1].first_layer, 4);
  ProgramContext context = Context(two);
  context.resume_step = 2;
  context.resume_dir = "/ckpt/step-2";
  context.resume_stage_begin = {0, 2, 4, 6};
  context.resume_files = StageFiles(4);
  const v1::JobProgram program = CompileRankProgram(halves, 1, context);
  ASSERT_EQ(program.resume_files_size(), 2);
  EXPECT_EQ(program.resume_files(0).stage(), 2);
  EXPECT_EQ(program.resume_files(1).stage(), 3);
  EXPECT_THAT(program.resume_stage_begin(), ::testing::ElementsAre(0, 2, 4, 6));
  // The worker re-plans it to the same program.
  absl::StatusOr<JobPlan> again = PlanOfProgram(program);
  ASSERT_TRUE(again.ok()) << again.status();
}

// A worker that profiled the job hands PlanOfProgram the file as it parsed
// it: the program's YAML is not loaded again. A ParsedJob of another text
// (or file name) is not used.
TEST(RankProgramTest, TheWorkerPlansFromTheJobItParsedAlready) {
  const std::string yaml =
      Yaml("{schedule: 1f1b, stages: auto, num_stages: 2}");
  absl::StatusOr<ParsedJob> parsed = ParseJob(yaml, "job.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<StageCut> cut = StageCut::Create(
      {0, 2}, static_cast<int>(parsed->spec.model.layers.size()));
  ASSERT_TRUE(cut.ok()) << cut.status();
  absl::StatusOr<JobPlan> chosen = PlanWithCut(parsed->spec, *cut);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  const v1::JobProgram program = CompileRankProgram(*chosen, 1, Context(yaml));
  TEST_CountYamlLoads(true);
  absl::StatusOr<JobPlan> again = PlanOfProgram(program, &*parsed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stages[1].first_layer, 2);
  EXPECT_EQ(TEST_YamlLoadsOf(yaml), 0);
  // Another file name: parsed again, and still the same plan.
  ParsedJob other = *parsed;
  other.file_name = "other.yaml";
  again = PlanOfProgram(program, &other);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TEST_YamlLoadsOf(yaml), 1);
  TEST_CountYamlLoads(false);
}

// A tied lm_head's weight is its embedding's: the rank holding the head
// also reads the file holding the embedding, whichever cut wrote it.
TEST(RankProgramTest, ATiedCopysRankReadsTheFileOfItsOriginal) {
  const std::string tokens = absl::StrCat(::testing::TempDir(), "/tokens.txt");
  std::ofstream(tokens) << "some text to tokenize, long enough for a batch";
  const std::string yaml = absl::StrCat(
      "model:\n  input_shape: [6]\n  init: {seed: 4}\n  layers:\n"
      "    - embedding: {vocab_size: 128, features: 8}\n"
      "    - boundary\n"
      "    - dense: {features: 8}\n"
      "    - boundary\n"
      "    - layernorm\n"
      "    - lm_head: {vocab_size: 128, tied: true}\n"
      "  loss: cross_entropy\n"
      "data: {source: tokens, path: ",
      tokens,
      ", seq_len: 6, vocab_size: 128}\n"
      "training: {steps: 4, batch_size: 8, microbatches: 4}\n"
      "optimizer: {kind: sgd, lr: 0.1}\npipeline: {schedule: 1f1b}\n");
  const JobPlan plan = Plan(yaml);
  ASSERT_EQ(plan.num_stages, 3);
  // Its own cut: the head's stage 2, and the embedding's stage 0.
  EXPECT_EQ(CheckpointStagesOf(plan, 2, {}), (std::set<int>{0, 2}));
  // From a 2-stage checkpoint cut before the layernorm.
  EXPECT_EQ(CheckpointStagesOf(plan, 2, {0, 2}), (std::set<int>{0, 1}));
  EXPECT_EQ(CheckpointStagesOf(plan, 1, {0, 2}), (std::set<int>{0}));
}

TEST(RankProgramTest, TheWorkerAcceptsWhatTheCoordinatorCompiled) {
  for (const std::string pipeline :
       {"{schedule: gpipe}", "{schedule: zb-h1}",
        "{schedule: interleaved-1f1b, virtual_stages: 2}"}) {
    const std::string yaml = Yaml(pipeline);
    const JobPlan plan = Plan(yaml);
    for (int r = 0; r < plan.num_ranks; ++r) {
      absl::StatusOr<JobPlan> again =
          PlanOfProgram(CompileRankProgram(plan, r, Context(yaml)));
      ASSERT_TRUE(again.ok())
          << pipeline << " rank " << r << ": " << again.status();
      EXPECT_EQ(again->schedule.actions, plan.schedule.actions);
    }
  }
}

TEST(RankProgramTest, TheWorkerPlansAnAutoJobWithTheChosenCut) {
  const std::string yaml =
      Yaml("{schedule: 1f1b, stages: auto, num_stages: 2}");
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  // 8 layers, 4 markers fixed: 2 stages can only be cut at a marker; the
  // test cuts where the search could, after layer 2.
  absl::StatusOr<StageCut> cut =
      StageCut::Create({0, 2}, static_cast<int>(spec->model.layers.size()));
  ASSERT_TRUE(cut.ok()) << cut.status();
  absl::StatusOr<JobPlan> chosen = PlanWithCut(*spec, *cut);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  const v1::JobProgram program = CompileRankProgram(*chosen, 0, Context(yaml));
  absl::StatusOr<JobPlan> again = PlanOfProgram(program);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stages[1].first_layer, 2);

  v1::JobProgram bad = program;
  bad.set_stage_begin(1, 99);
  EXPECT_EQ(PlanOfProgram(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// schedule: auto: the YAML says "auto"; the program carries the schedule,
// V and cut the coordinator chose, and the worker plans exactly that.
TEST(RankProgramTest, TheWorkerPlansTheScheduleAutoChose) {
  const std::string yaml = Yaml("{schedule: auto, stages: auto, workers: 4}");
  const JobPlan plan = Plan(yaml);
  std::vector<engine::LayerProfile> profile;
  for (int i = 0; i < 8; ++i) {
    const double f = i >= 6 ? 4e-3 : 1e-3;
    profile.push_back({.forward_seconds = f,
                       .backward_input_seconds = f,
                       .backward_weight_seconds = f,
                       .activation_bytes = 1000,
                       .parameter_bytes = 100});
  }
  absl::StatusOr<JobPlan> chosen = ChooseStages(plan, profile, "cpu:1", false);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_NE(chosen->job.pipeline.schedule, "auto");
  EXPECT_EQ(chosen->num_ranks, 4);
  for (int r = 0; r < 4; ++r) {
    const v1::JobProgram program =
        CompileRankProgram(*chosen, r, Context(yaml));
    EXPECT_EQ(program.schedule(), chosen->job.pipeline.schedule);
    EXPECT_EQ(program.virtual_stages(), chosen->virtual_stages);
    absl::StatusOr<JobPlan> again = PlanOfProgram(program);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->schedule.kind, chosen->schedule.kind);
    EXPECT_EQ(again->schedule.actions, chosen->schedule.actions);
  }
  // A program without the choice (or with one that does not fit the
  // workers) is refused, not guessed at.
  v1::JobProgram bad = CompileRankProgram(*chosen, 0, Context(yaml));
  bad.set_schedule("");
  EXPECT_THAT(PlanOfProgram(bad).status().message(),
              HasSubstr("schedule: auto needs the chosen schedule"));
  bad = CompileRankProgram(*chosen, 0, Context(yaml));
  bad.set_virtual_stages(3);
  EXPECT_EQ(PlanOfProgram(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// An eval section gives every rank its share of the forward-only schedule
// (over K * M microbatches, on the training schedule's placement), which the
// worker plans again and checks like the training actions.
TEST(RankProgramTest, CarriesEachRanksEvaluationForwards) {
  const std::string yaml = absl::StrCat(
      Yaml("{schedule: zb-v}"),
      "eval: {every: 2, batches: 3, data: {source: synthetic-regression}}\n");
  const JobPlan plan = Plan(yaml);
  ASSERT_TRUE(plan.eval_schedule.has_value());
  EXPECT_TRUE(plan.eval_schedule->forward_only);
  EXPECT_EQ(plan.eval_schedule->microbatches, 12);
  EXPECT_EQ(plan.eval_schedule->placement, scheduler::Placement::kV);
  for (int r = 0; r < plan.num_ranks; ++r) {
    const v1::JobProgram program = CompileRankProgram(plan, r, Context(yaml));
    auto eval = proto::ActionsFromProto(program.eval_actions(), 4);
    ASSERT_TRUE(eval.ok()) << eval.status();
    EXPECT_EQ(*eval, plan.eval_schedule->actions[r]);
    EXPECT_EQ(eval->size(), 2u * 12u);  // Two stages a rank, 12 forwards.
    ASSERT_TRUE(PlanOfProgram(program).ok());
    v1::JobProgram dropped = program;
    dropped.mutable_eval_actions()->RemoveLast();
    absl::Status s = PlanOfProgram(dropped).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("eval_actions"));
  }
  EXPECT_EQ(CompileRankProgram(Plan(Yaml("{schedule: 1f1b}")), 0,
                               Context(Yaml("{schedule: 1f1b}")))
                .eval_actions_size(),
            0);
}

TEST(RankProgramTest, TheWorkerRefusesAnyDifferenceNamingIt) {
  const std::string yaml = Yaml("{schedule: 1f1b}");
  const v1::JobProgram good = CompileRankProgram(Plan(yaml), 1, Context(yaml));
  ASSERT_TRUE(PlanOfProgram(good).ok());

  v1::JobProgram names = good;
  names.mutable_stages(0)->set_parameter_names(0, "layers.2.kernel");
  absl::Status s = PlanOfProgram(names).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("program/build mismatch"));
  EXPECT_THAT(s.message(), HasSubstr("layers.2.kernel"));

  v1::JobProgram layers = good;
  layers.mutable_stages(0)->set_num_layers(3);
  EXPECT_THAT(PlanOfProgram(layers).status().message(),
              HasSubstr("num_layers"));

  v1::JobProgram action = good;
  action.mutable_actions()->RemoveLast();
  EXPECT_EQ(PlanOfProgram(action).status().code(),
            absl::StatusCode::kFailedPrecondition);

  v1::JobProgram steps = good;
  steps.set_steps(2);
  EXPECT_EQ(PlanOfProgram(steps).status().code(),
            absl::StatusCode::kFailedPrecondition);

  v1::JobProgram stages = good;
  stages.set_num_stages(8);
  stages.set_num_ranks(8);
  EXPECT_EQ(PlanOfProgram(stages).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(RankProgramTest, RefusesAProgramInconsistentInItself) {
  const std::string yaml = Yaml("{schedule: 1f1b}");
  const v1::JobProgram good = CompileRankProgram(Plan(yaml), 0, Context(yaml));
  v1::JobProgram rank = good;
  rank.set_rank(4);
  EXPECT_EQ(PlanOfProgram(rank).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::JobProgram resume = good;
  resume.set_resume_step(4);
  EXPECT_EQ(PlanOfProgram(resume).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::JobProgram yaml_error = good;
  yaml_error.set_yaml("model: [");
  EXPECT_EQ(PlanOfProgram(yaml_error).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor::job
