// Two JobRunners, one thread each, over real TcpChannels on loopback, given
// the programs the coordinator's planner makes: the job they train must be
// the in-process reference job (final parameters and losses), the stage
// files must land where conveyorctl export looks for them, a cancel must
// stop both ranks at once, and a program the build disagrees with must be
// refused.
#include "worker/job_runner.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "common/cancellation.h"
#include "common/host_memory.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/planner.h"
#include "job/rank_program.h"
#include "job/trainer.h"
#include "proto/protocol.h"
#include "tests/engine/test_util.h"
#include "tests/worker/run_job.h"

namespace conveyor::worker {
namespace {

using testing_util::Programs;
using testing_util::Reference;
using testing_util::Result;
using testing_util::RunJob;

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

struct JobOptions {
  std::string schedule = "1f1b";
  int stages = 2;
  int virtual_stages = 1;
  bool clip = false;
  int steps = 3;
  int devices_per_stage = 1;  // > 1: every stage on a CPU mesh.
  const char* precision = "fp32";
  // A gelu first in every stage after the first: under bf16 the boundary's
  // rounding then shows in the forward too (a dense layer first rounds its
  // input to bf16 anyway, and rounding twice is rounding once).
  bool gelu_first = false;
};

// An MLP with `stages` stages (one dense + gelu each, then a head).
std::string JobYaml(const JobOptions& o) {
  std::string layers;
  for (int s = 0; s < o.stages; ++s) {
    if (s > 0) layers += "    - boundary\n";
    if (s > 0 && o.gelu_first) layers += "    - gelu\n";
    layers += "    - dense: {features: 12}\n    - gelu\n";
  }
  layers += "    - dense: {features: 4}\n";
  return absl::StrCat(
      "name: pipe\n"
      "model:\n  input_shape: [6]\n  init: {seed: 4}\n  layers:\n",
      layers,
      "  loss: mse\n"
      "data: {source: synthetic-regression, seed: 9}\n"
      "training: {steps: ",
      o.steps, ", batch_size: 16, microbatches: 4, precision: ", o.precision,
      "}\n"
      "optimizer: {kind: adamw, lr: 0.01",
      // Small: clipping happens on every step.
      o.clip ? ", clip_grad_norm: 0.05" : "",
      "}\n"
      "pipeline: {schedule: ",
      o.schedule, ", virtual_stages: ", o.virtual_stages,
      ", devices_per_stage: ", o.devices_per_stage, "}\n");
}

std::string TempDir(absl::string_view name) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat("job_runner_test_", getpid(), "_", name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

struct Case {
  JobOptions job;
  const char* what;
  const char* name;  // The test's name suffix.
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.what; }

class JobRunnerEqualsReferenceTest : public ::testing::TestWithParam<Case> {};

// Without clipping every rank runs the reference's kernels in the same
// order: bitwise equal. With clipping the global norm is summed across ranks
// in another order than the reference's, and on a mesh each weight gradient
// is a sum of the devices' partial sums: allclose.
TEST_P(JobRunnerEqualsReferenceTest, FinalParametersLossesAndRates) {
  const Case& c = GetParam();
  const std::string yaml = JobYaml(c.job);
  const Result got = RunJob(Programs(yaml));
  const Result want = Reference(yaml);
  ASSERT_EQ(got.statuses.size(), 2u);
  for (const absl::Status& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [name, values] : want.params) {
    ASSERT_TRUE(got.params.count(name)) << name;
    if (c.job.clip || c.job.devices_per_stage > 1) {
      EXPECT_TRUE(engine::testing_util::AllClose(got.params.at(name), values,
                                                 1e-5, 1e-6))
          << c.what << ": " << name;
    } else {
      EXPECT_EQ(got.params.at(name), values) << c.what << ": " << name;
    }
  }
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-6 * std::abs(want.losses[i]))
        << c.what << " step " << i;
  }
  EXPECT_EQ(got.learning_rates, want.learning_rates);
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, JobRunnerEqualsReferenceTest,
    ::testing::Values(
        Case{{.schedule = "1f1b", .stages = 2}, "1f1b P=2", "OneFOneB"},
        Case{{.schedule = "1f1b", .stages = 2, .clip = true},
             "1f1b P=2 clipped",
             "OneFOneBClipped"},
        Case{{.schedule = "interleaved-1f1b", .stages = 4, .virtual_stages = 2},
             "interleaved P=2 V=2",
             "InterleavedV2"},
        Case{{.schedule = "interleaved-1f1b",
              .stages = 4,
              .virtual_stages = 2,
              .clip = true},
             "interleaved P=2 V=2 clipped",
             "InterleavedV2Clipped"},
        Case{{.schedule = "1f1b", .stages = 2, .devices_per_stage = 2},
             "1f1b P=2, 2 devices per stage",
             "OneFOneBMeshOfTwo"},
        // bf16: boundary tensors travel as bf16, and the reference rounds
        // them the same way (engine/boundary_precision.h).
        Case{{.schedule = "1f1b",
              .stages = 2,
              .precision = "bf16",
              .gelu_first = true},
             "1f1b P=2 bf16",
             "OneFOneBBf16"},
        Case{{.schedule = "interleaved-1f1b",
              .stages = 4,
              .virtual_stages = 2,
              .precision = "bf16",
              .gelu_first = true},
             "interleaved P=2 V=2 bf16",
             "InterleavedV2Bf16"},
        Case{{.schedule = "zb-h1",
              .stages = 2,
              .precision = "bf16",
              .gelu_first = true},
             "zb-h1 P=2 bf16",
             "ZeroBubbleH1Bf16"},
        Case{{.schedule = "interleaved-1f1b",
              .stages = 4,
              .virtual_stages = 2,
              .clip = true,
              .devices_per_stage = 4},
             "interleaved P=2 V=2 clipped, 4 devices per stage",
             "InterleavedV2ClippedMeshOfFour"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(info.param.name);
    });

// Counts the data plane's bytes sent by one rank.
class CountingObserver final : public transport::DataPlaneObserver {
 public:
  void OnSent(int, uint64_t bytes,
              std::chrono::steady_clock::duration) override {
    sent_.fetch_add(bytes);
  }
  void OnReceived(int, uint64_t) override {}
  void OnError(Error) override {}
  uint64_t sent() const { return sent_.load(); }

 private:
  std::atomic<uint64_t> sent_{0};
};

// Under training.precision: bf16 the activations and gradients between
// stages travel as bf16: half the bytes of the same job in fp32 (the rest,
// the step's gradient-norm sums, is a few scalars).
TEST(JobRunnerTest, Bf16HalvesThePointToPointBytes) {
  auto bytes_sent = [](const char* precision) {
    const std::string yaml = JobYaml({.stages = 2, .precision = precision});
    std::vector<CountingObserver> observers(2);
    std::vector<JobRunnerOptions> options(2);
    for (int r = 0; r < 2; ++r) options[r].observer = &observers[r];
    const Result got = RunJob(Programs(yaml), nullptr, options);
    for (const absl::Status& s : got.statuses) EXPECT_TRUE(s.ok()) << s;
    return observers[0].sent() + observers[1].sent();
  };
  const uint64_t fp32 = bytes_sent("fp32"), bf16 = bytes_sent("bf16");
  std::cout << "bytes sent: fp32 " << fp32 << ", bf16 " << bf16 << "\n";
  ASSERT_GT(fp32, 0u);
  EXPECT_GE(2 * bf16, fp32 * 99 / 100);
  EXPECT_LE(2 * bf16, fp32 * 101 / 100);
}

TEST(JobRunnerTest, WritesOneFilePerStageWithMetadata) {
  const std::string dir = TempDir("checkpoint");
  const std::string yaml = JobYaml(
      {.schedule = "interleaved-1f1b", .stages = 4, .virtual_stages = 2});
  const Result got = RunJob(Programs(yaml, dir));
  for (const absl::Status& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  for (int stage = 0; stage < 4; ++stage) {
    const std::string path = checkpoint::StageFilePath(dir, 3, stage);
    EXPECT_EQ(path, absl::StrCat(dir, "/step-3/stage-", stage, ".safetensors"));
    auto file = engine::SafetensorsReader::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    const std::map<std::string, std::string> want = {
        {"job", "pipe"},
        {"stage", absl::StrCat(stage)},
        {"num_stages", "4"},
        {"step", "3"},
        {"optimizer_step", "3"},
        {"samples_seen", "48"},
        {"format", "conveyor-stage-v1"}};
    EXPECT_EQ(file->metadata(), want) << path;
    // Stage s holds layers 2s (dense) and 2s+1 (gelu); the head is on the
    // last stage: the files hold those parameters, with their final values.
    std::vector<std::string> names;
    for (const auto& t : file->tensors()) names.push_back(t.name);
    std::vector<std::string> expected = {
        absl::StrCat("layers.", 2 * stage, ".bias"),
        absl::StrCat("layers.", 2 * stage, ".weight")};
    if (stage == 3) {
      expected.push_back("layers.8.bias");
      expected.push_back("layers.8.weight");
    }
    const std::vector<std::string> params = expected;
    for (const std::string& name : params) {
      for (const char* slot : {"exp_avg", "exp_avg_sq"}) {
        expected.push_back(absl::StrCat("optimizer/", slot, "/", name));
      }
    }
    EXPECT_THAT(names, ::testing::UnorderedElementsAreArray(expected));
    for (const std::string& name : params) {
      auto values = file->ReadF32(name);
      ASSERT_TRUE(values.ok()) << values.status();
      EXPECT_EQ(*values, got.params.at(name)) << name;
    }
  }
  // Nothing else: no temporary files left behind, no other step.
  int entries = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 5);  // step-3 and its 4 files.
  std::filesystem::remove_all(dir);
}

// Checkpoints are written in the background from a snapshot taken at the
// step boundary: every step's file holds that step's parameters although
// the next steps ran meanwhile, the report comes from another thread, and
// the job's end waits for the last write.
TEST(JobRunnerTest, CheckpointsWrittenInTheBackgroundHoldTheirStepsState) {
  const std::string dir = TempDir("background");
  const std::string yaml =
      absl::StrCat(JobYaml({.stages = 1, .steps = 4}),
                   "checkpoint: {dir: unused, every: 1}\n");
  std::vector<v1::JobProgram> programs = Programs(yaml, dir);
  ASSERT_EQ(programs.size(), 1u);
  std::mutex mu;
  std::vector<CheckpointWrite> writes;
  std::vector<std::thread::id> report_threads;
  // The parameters after each step, by name.
  std::map<int64_t, std::map<std::string, std::vector<float>>> after_step;
  std::thread::id job_thread;
  JobRunnerOptions options;
  options.on_checkpoint = [&](const CheckpointWrite& w) {
    std::lock_guard<std::mutex> lock(mu);
    writes.push_back(w);
    report_threads.push_back(std::this_thread::get_id());
  };
  absl::StatusOr<std::unique_ptr<JobRunner>> runner =
      JobRunner::Create(programs[0], options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE((*runner)->Start({(*runner)->data_endpoint()}).ok());
  const absl::Status run = (*runner)->Run([&](const StepProgress& p) {
    job_thread = std::this_thread::get_id();
    for (engine::Parameter* param : (*runner)->parameters()) {
      after_step[p.step][param->name] =
          engine::testing_util::ToVector(param->value);
    }
  });
  ASSERT_TRUE(run.ok()) << run;
  // Run returned after every write was reported.
  ASSERT_EQ(writes.size(), 4u);
  for (size_t k = 0; k < writes.size(); ++k) {
    const CheckpointWrite& w = writes[k];
    EXPECT_EQ(w.step, static_cast<int64_t>(k) + 1);
    EXPECT_TRUE(w.status.ok()) << w.status;
    ASSERT_EQ(w.files.size(), 1u);
    EXPECT_GE(w.wait_seconds, 0.0);
    EXPECT_GE(w.snapshot_seconds, 0.0);
    EXPECT_NE(report_threads[k], job_thread);
    auto file = engine::SafetensorsReader::Open(
        checkpoint::StageFilePath(dir, w.step, 0));
    ASSERT_TRUE(file.ok()) << file.status();
    for (const auto& [name, values] : after_step.at(w.step)) {
      EXPECT_EQ(*file->ReadF32(name), values) << "step " << w.step << name;
    }
  }
  std::filesystem::remove_all(dir);
}

// A write that fails in the background fails the job at the next
// checkpoint (or its end), with the write's error, and is reported.
TEST(JobRunnerTest, ABackgroundWriteThatFailsFailsTheJob) {
  const std::string dir = TempDir("background_fails");
  const std::string yaml =
      absl::StrCat(JobYaml({.stages = 1, .steps = 4}),
                   "checkpoint: {dir: unused, every: 1}\n");
  std::vector<v1::JobProgram> programs = Programs(yaml, dir);
  // A file where step 2's directory goes.
  std::filesystem::create_directories(dir);
  std::ofstream(checkpoint::StepDirPath(dir, 2)) << "in the way";
  std::mutex mu;
  std::vector<CheckpointWrite> writes;
  JobRunnerOptions options;
  options.on_checkpoint = [&](const CheckpointWrite& w) {
    std::lock_guard<std::mutex> lock(mu);
    writes.push_back(w);
  };
  const Result got = RunJob(programs, nullptr, {options});
  ASSERT_EQ(got.statuses.size(), 1u);
  EXPECT_FALSE(got.statuses[0].ok());
  EXPECT_THAT(got.statuses[0].message(), HasSubstr("step-2"));
  ASSERT_GE(writes.size(), 2u);
  EXPECT_TRUE(writes[0].status.ok()) << writes[0].status;
  EXPECT_EQ(writes[1].step, 2);
  EXPECT_FALSE(writes[1].status.ok());
  // The next checkpoint (step 3) found the error before writing anything.
  EXPECT_EQ(writes.size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(checkpoint::StepDirPath(dir, 3)));
  std::filesystem::remove_all(dir);
}

// Programs that resume from step `step` of `dir`, as the coordinator makes
// them from the step's manifest.
std::vector<v1::JobProgram> ResumePrograms(const std::string& yaml,
                                           const std::string& dir,
                                           const std::string& resume_dir,
                                           int64_t step) {
  std::vector<v1::JobProgram> programs = Programs(yaml, dir);
  for (v1::JobProgram& p : programs) {
    p.set_resume_step(step);
    p.set_resume_dir(checkpoint::StepDirPath(resume_dir, step));
    for (const v1::StageProgram& sp : p.stages()) {
      absl::StatusOr<checkpoint::StageFileDigest> d =
          checkpoint::DigestStageFile(checkpoint::StepDirPath(resume_dir, step),
                                      sp.stage());
      EXPECT_TRUE(d.ok()) << d.status();
      if (!d.ok()) continue;
      v1::StageFile* f = p.add_resume_files();
      f->set_stage(d->stage);
      f->set_file(d->file);
      f->set_bytes(d->bytes);
      f->set_crc32c(d->crc32c);
    }
  }
  return programs;
}

// The heart of resume: interrupted after a checkpoint and resumed from it, a
// job ends with the bitwise parameters of one that never stopped, for every
// optimizer kind that keeps state and with clipping (a cross-rank
// reduction) on.
TEST(JobRunnerTest, ResumedFromACheckpointEqualsUninterruptedBitwise) {
  for (const std::string optimizer : {"adamw", "sgd"}) {
    JobOptions o{.schedule = "interleaved-1f1b",
                 .stages = 4,
                 .virtual_stages = 2,
                 .clip = true,
                 .steps = 6};
    std::string yaml = JobYaml(o);
    if (optimizer == "sgd") {
      yaml = absl::StrReplaceAll(yaml, {{"kind: adamw, lr: 0.01",
                                         "kind: sgd, lr: 0.05, momentum: "
                                         "0.9"}});
    }
    yaml += "checkpoint: {dir: unused, every: 2}\n";
    const std::string full = TempDir(optimizer + "_full");
    const std::string part = TempDir(optimizer + "_part");
    const Result uninterrupted = RunJob(Programs(yaml, full));
    for (const absl::Status& s : uninterrupted.statuses) {
      ASSERT_TRUE(s.ok()) << s;
    }
    // Checkpoints at 2, 4 and 6 (every 2, and the last).
    for (int step : {2, 4, 6}) {
      EXPECT_TRUE(
          std::filesystem::exists(checkpoint::StageFilePath(full, step, 3)))
          << step;
    }
    // A second run resumes from the first run's step 2 and writes its own.
    const Result resumed = RunJob(ResumePrograms(yaml, part, full, 2));
    for (const absl::Status& s : resumed.statuses) ASSERT_TRUE(s.ok()) << s;
    EXPECT_FALSE(std::filesystem::exists(checkpoint::StepDirPath(part, 2)));
    EXPECT_TRUE(std::filesystem::exists(checkpoint::StageFilePath(part, 4, 0)));
    ASSERT_EQ(resumed.params.size(), uninterrupted.params.size());
    for (const auto& [name, values] : uninterrupted.params) {
      EXPECT_EQ(resumed.params.at(name), values) << optimizer << " " << name;
    }
    // Steps 3..6 ran, with the learning rates of those steps.
    EXPECT_EQ(resumed.learning_rates.size(), 4u);
    // The optimizer state written at the end is the same too.
    for (int stage = 0; stage < 4; ++stage) {
      auto a = *engine::SafetensorsReader::Open(
          checkpoint::StageFilePath(full, 6, stage));
      auto b = *engine::SafetensorsReader::Open(
          checkpoint::StageFilePath(part, 6, stage));
      for (const auto& t : a.tensors()) {
        EXPECT_EQ(*a.ReadF32(t.name), *b.ReadF32(t.name)) << t.name;
      }
    }
    std::filesystem::remove_all(full);
    std::filesystem::remove_all(part);
  }
}

// A checkpoint whose files pass their checksums but lack a parameter (or
// its optimizer state) is refused naming the tensor, the step and what to
// do, before any step runs.
TEST(JobRunnerTest, AResumeFileWithoutAParameterIsRefusedNamingIt) {
  std::string yaml = JobYaml({.steps = 2});
  yaml += "checkpoint: {dir: unused, every: 1}\n";
  const std::string full = TempDir("missing_full");
  const Result first = RunJob(Programs(yaml, full));
  for (const absl::Status& s : first.statuses) ASSERT_TRUE(s.ok()) << s;
  for (const bool state : {false, true}) {
    SCOPED_TRACE(state ? "optimizer state" : "parameter");
    // Stage 1's file of step 1, written again without one tensor.
    absl::StatusOr<checkpoint::StageFile> file = checkpoint::ReadStageFile(
        checkpoint::StepDirPath(full, 1),
        *checkpoint::DigestStageFile(checkpoint::StepDirPath(full, 1), 1),
        {.step = 1});
    ASSERT_TRUE(file.ok()) << file.status();
    const std::string dropped =
        state ? "optimizer/exp_avg/layers.2.weight" : "layers.2.weight";
    ASSERT_NE(file->tensors.Find(dropped), nullptr);
    std::vector<std::vector<float>> keep;
    std::vector<engine::TensorToWrite> tensors;
    for (const engine::TensorInfo& t : file->tensors.tensors()) {
      if (t.name == dropped) continue;
      keep.push_back(*file->tensors.ReadF32(t.name));
      tensors.push_back({.name = t.name,
                         .dtype = engine::DType::kF32,
                         .shape = t.shape,
                         .data = keep.back().data(),
                         .bytes = keep.back().size() * sizeof(float)});
    }
    const std::string broken = TempDir("missing_broken");
    ASSERT_TRUE(checkpoint::WriteStageFile(broken, file->info, tensors).ok());
    // Step 1 of `broken`: stage 1 without the tensor, stage 0 as written.
    std::filesystem::copy_file(checkpoint::StageFilePath(full, 1, 0),
                               checkpoint::StageFilePath(broken, 1, 0));
    // Refused while the rank is built, before it could run a step.
    const absl::Status refused =
        JobRunner::Create(
            ResumePrograms(yaml, TempDir("missing_part"), broken, 1)[1], {})
            .status();
    // Either way a reason of the job's own, which a restart would meet too.
    EXPECT_EQ(refused.code(), state ? absl::StatusCode::kNotFound
                                    : absl::StatusCode::kInvalidArgument)
        << refused;
    EXPECT_THAT(refused.message(),
                HasSubstr(absl::StrCat("resuming from step 1 (", broken)));
    EXPECT_THAT(refused.message(), HasSubstr(dropped));
    EXPECT_THAT(refused.message(),
                HasSubstr("resume from another step (resume: N)"));
    std::filesystem::remove_all(broken);
  }
  std::filesystem::remove_all(full);
}

// A byte-token model over 3 stages whose lm_head (stage 2) is tied to the
// embedding (stage 0), on a CPU mesh of `devices` per stage.
std::string TiedJobYaml(const std::string& tokens, int devices) {
  return absl::StrCat(
      "name: tied\n"
      "model:\n  input_shape: [6]\n  init: {seed: 4}\n  layers:\n"
      "    - embedding: {vocab_size: 128, features: 8}\n"
      "    - boundary\n"
      "    - transformer_block: {heads: 2, mlp_features: 16, causal: true}\n"
      "    - boundary\n"
      "    - layernorm\n"
      "    - lm_head: {vocab_size: 128, tied: true}\n"
      "  loss: cross_entropy\n"
      "data: {source: tokens, path: ",
      tokens,
      ", seq_len: 6, vocab_size: 128}\n"
      "training: {steps: 4, batch_size: 8, microbatches: 4}\n"
      // SGD: the key bias's true-zero gradient is rounding noise, which Adam
      // would turn into steps that differ with the order of the sums.
      "optimizer: {kind: sgd, lr: 0.1, momentum: 0.9, clip_grad_norm: 0.5}\n"
      "pipeline: {schedule: 1f1b, devices_per_stage: ",
      devices, "}\ncheckpoint: {dir: unused, every: 2}\n");
}

// 600 printable bytes in `dir`/tokens.bin, the tied jobs' data.
void WriteTokens(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::string text;
  for (int i = 0; i < 600; ++i) text.push_back(static_cast<char>(32 + i % 89));
  std::ofstream(dir + "/tokens.bin", std::ios::binary) << text;
}

// `programs` (ResumePrograms, one stage per rank) compiled again as the
// coordinator does: from the manifest's files of every stage, each rank
// picking those that hold its parameters.
std::vector<v1::JobProgram> CompileWithEveryFile(
    const std::vector<v1::JobProgram>& programs) {
  auto job = job::ParseJobSpec(programs[0].yaml(), "job.yaml");
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  auto plan = job::PlanJob(*job);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  std::vector<v1::StageFile> files;
  for (const v1::JobProgram& p : programs) files.push_back(p.resume_files(0));
  std::vector<v1::JobProgram> compiled;
  for (int r = 0; r < static_cast<int>(programs.size()); ++r) {
    job::ProgramContext context = job::ContextOf(programs[r]);
    context.resume_files = files;
    compiled.push_back(job::CompileRankProgram(*plan, r, context));
  }
  return compiled;
}

// A tied embedding is checkpointed once, by the stage of the original, with
// its optimizer state; the last stage's rank resumes its copy from that
// file, and the resumed job ends bitwise where the uninterrupted one does,
// its copies equal to their originals (checked by the runners every step,
// and here).
TEST(JobRunnerTest, ATiedJobHoldsTheEmbeddingOnceAndResumesBitwise) {
  const std::string tokens = TempDir("tied_tokens");
  WriteTokens(tokens);
  JobRunnerOptions check;
  check.check_tied = true;
  const std::vector<JobRunnerOptions> checked(3, check);
  for (int devices : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(devices, " devices per stage"));
    const std::string yaml = TiedJobYaml(tokens + "/tokens.bin", devices);
    const std::string full = TempDir("tied_full");
    const std::string part = TempDir("tied_part");
    const Result uninterrupted = RunJob(Programs(yaml, full), nullptr, checked);
    ASSERT_EQ(uninterrupted.statuses.size(), 3u);
    for (const absl::Status& s : uninterrupted.statuses) {
      ASSERT_TRUE(s.ok()) << s;
    }
    ASSERT_EQ(uninterrupted.tied_copies.size(), 1u);
    EXPECT_EQ(uninterrupted.tied_copies.at("layers.0.weight"),
              uninterrupted.params.at("layers.0.weight"));
    // Equal to the in-process reference (allclose: the norm's sum across
    // ranks and a mesh's gradient sums run in another order).
    const Result want = Reference(yaml);
    for (const auto& [name, values] : want.params) {
      EXPECT_TRUE(engine::testing_util::AllClose(uninterrupted.params.at(name),
                                                 values, 1e-5, 1e-6))
          << name;
    }
    // Once: in stage 0's file, with its state; not in stage 2's.
    auto first =
        *engine::SafetensorsReader::Open(checkpoint::StageFilePath(full, 2, 0));
    auto last =
        *engine::SafetensorsReader::Open(checkpoint::StageFilePath(full, 2, 2));
    EXPECT_NE(first.Find("layers.0.weight"), nullptr);
    EXPECT_NE(first.Find("optimizer/momentum_buffer/layers.0.weight"), nullptr);
    for (const auto& t : last.tensors()) {
      EXPECT_FALSE(absl::StrContains(t.name, "layers.0.")) << t.name;
    }

    // The coordinator's programs give the last rank stage 0's file too.
    const std::vector<v1::JobProgram> compiled =
        CompileWithEveryFile(ResumePrograms(yaml, part, full, 2));
    ASSERT_EQ(compiled.size(), 3u);
    std::vector<int> last_rank_files;
    for (const v1::StageFile& f : compiled[2].resume_files()) {
      last_rank_files.push_back(f.stage());
    }
    EXPECT_THAT(last_rank_files, ::testing::UnorderedElementsAre(0, 2));
    EXPECT_EQ(compiled[1].resume_files_size(), 1);
    const Result resumed = RunJob(compiled, nullptr, checked);
    for (const absl::Status& s : resumed.statuses) ASSERT_TRUE(s.ok()) << s;
    for (const auto& [name, values] : uninterrupted.params) {
      EXPECT_EQ(resumed.params.at(name), values) << name;
    }
    EXPECT_EQ(resumed.tied_copies, uninterrupted.tied_copies);
    EXPECT_EQ(resumed.learning_rates.size(), 2u);
    std::filesystem::remove_all(full);
    std::filesystem::remove_all(part);
  }
  std::filesystem::remove_all(tokens);
}

// Issue 21: devices_per_stage is part of the pipeline section, so a
// checkpoint resumes on another mesh size. A mesh sums each weight
// gradient over its devices' partial sums, in another order than one
// device does, so the run that moved ends allclose (not bitwise) to the one
// that never did, as a mesh run is to the reference (the tolerance of the
// mesh cases above).
TEST(JobRunnerTest, ResumesOnAnotherMeshSizeAllcloseToTheRunThatNeverMoved) {
  const std::string tokens = TempDir("mesh_move_tokens");
  WriteTokens(tokens);
  for (const auto& [from, to] : {std::pair{1, 2}, std::pair{2, 1}}) {
    SCOPED_TRACE(absl::StrCat(from, " -> ", to, " devices per stage"));
    const std::string full = TempDir("mesh_move_full");
    const std::string part = TempDir("mesh_move_part");
    const Result uninterrupted =
        RunJob(Programs(TiedJobYaml(tokens + "/tokens.bin", from), full));
    for (const absl::Status& s : uninterrupted.statuses) {
      ASSERT_TRUE(s.ok()) << s;
    }
    const Result resumed = RunJob(CompileWithEveryFile(ResumePrograms(
        TiedJobYaml(tokens + "/tokens.bin", to), part, full, 2)));
    ASSERT_EQ(resumed.statuses.size(), 3u);
    for (const absl::Status& s : resumed.statuses) ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(resumed.learning_rates.size(), 2u);  // Steps 3 and 4 only.
    ASSERT_EQ(resumed.params.size(), uninterrupted.params.size());
    for (const auto& [name, values] : uninterrupted.params) {
      EXPECT_TRUE(engine::testing_util::AllClose(resumed.params.at(name),
                                                 values, 1e-5, 1e-6))
          << name;
    }
    std::filesystem::remove_all(full);
    std::filesystem::remove_all(part);
  }
  std::filesystem::remove_all(tokens);
}

// The tied Llama job with every stage on a mesh of `devices` devices split
// into tensor-parallel groups of `tp` (the llama_block's 4 heads, 4
// key/value heads and 16 hidden units split over 1, 2 or 4 ranks).
std::string TiedLlamaJobYaml(const std::string& tokens, int devices, int tp,
                             const std::string& schedule, int steps) {
  return absl::StrCat(
      "name: tied-llama\n"
      "model:\n  input_shape: [6]\n  init: {seed: 4}\n  layers:\n"
      "    - embedding: {vocab_size: 128, features: 8}\n"
      "    - boundary\n"
      "    - llama_block: {heads: 4, kv_heads: 4, mlp_features: 16}\n"
      "    - llama_block: {heads: 4, kv_heads: 4, mlp_features: 16}\n"
      "    - boundary\n"
      "    - rmsnorm\n"
      "    - lm_head: {vocab_size: 128, tied: true}\n"
      "  loss: cross_entropy\n"
      "data: {source: tokens, path: ",
      tokens,
      ", seq_len: 6, vocab_size: 128}\n"
      "training: {steps: ",
      steps,
      ", batch_size: 8, microbatches: 2}\n"
      "optimizer: {kind: sgd, lr: 0.1, momentum: 0.9, clip_grad_norm: 0.5}\n"
      "pipeline: {schedule: ",
      schedule, ", devices_per_stage: ", devices, ", tensor_parallel: ", tp,
      "}\ncheckpoint: {dir: unused, every: 2}\n");
}

// Tensor parallelism reorders f32 sums only (each row-parallel projection's
// inner sum in T parts, and with replicas the gradients' sums over rows), a
// few ulps of the terms per step; over 6 SGD steps with momentum that stays
// far below 1e-4 of each tensor's largest magnitude, while a wrong shard or
// reduction is off by O(1).
::testing::AssertionResult CloseToReference(const std::vector<float>& got,
                                            const std::vector<float>& want) {
  float scale = 0;
  for (float x : want) scale = std::max(scale, std::abs(x));
  return engine::testing_util::AllClose(got, want, 1e-4, 1e-4 * scale);
}

TEST(JobRunnerTest, TensorParallelStagesTrainAsTheInProcessRun) {
  const std::string tokens = TempDir("tp_tokens");
  WriteTokens(tokens);
  const Result want =
      Reference(TiedLlamaJobYaml(tokens + "/tokens.bin", 1, 1, "1f1b", 6));
  for (const auto& [devices, tp, schedule] :
       {std::tuple{2, 2, "1f1b"}, std::tuple{4, 4, "zb-h1"},
        std::tuple{4, 2, "1f1b"}}) {
    SCOPED_TRACE(absl::StrCat(devices, " devices, tensor_parallel ", tp, ", ",
                              schedule));
    const std::string dir = TempDir("tp_run");
    const Result run = RunJob(Programs(
        TiedLlamaJobYaml(tokens + "/tokens.bin", devices, tp, schedule, 6),
        dir));
    for (const absl::Status& s : run.statuses) ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(run.params.size(), want.params.size());
    for (const auto& [name, values] : want.params) {
      EXPECT_TRUE(CloseToReference(run.params.at(name), values)) << name;
    }
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove_all(tokens);
}

// Checkpoints hold whole tensors under their global names, so a job moves
// between tensor-parallel layouts: T = 2 for steps 1-2, T = 1 for 3-4,
// T = 4 for 5-6 ends as the in-process run does.
TEST(JobRunnerTest, ResumesAcrossTensorParallelLayouts) {
  const std::string tokens = TempDir("tp_move_tokens");
  WriteTokens(tokens);
  const std::string data = tokens + "/tokens.bin";
  const std::string first = TempDir("tp_move_1"), second = TempDir("tp_move_2"),
                    third = TempDir("tp_move_3");
  const Result a =
      RunJob(Programs(TiedLlamaJobYaml(data, 2, 2, "1f1b", 6), first));
  for (const absl::Status& s : a.statuses) ASSERT_TRUE(s.ok()) << s;
  const Result b = RunJob(CompileWithEveryFile(ResumePrograms(
      TiedLlamaJobYaml(data, 1, 1, "1f1b", 6), second, first, 2)));
  for (const absl::Status& s : b.statuses) ASSERT_TRUE(s.ok()) << s;
  const Result c = RunJob(CompileWithEveryFile(ResumePrograms(
      TiedLlamaJobYaml(data, 4, 4, "1f1b", 6), third, second, 4)));
  for (const absl::Status& s : c.statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.learning_rates.size(), 2u);  // Steps 5 and 6 only.
  const Result want = Reference(TiedLlamaJobYaml(data, 1, 1, "1f1b", 6));
  ASSERT_EQ(c.params.size(), want.params.size());
  for (const auto& [name, values] : want.params) {
    EXPECT_TRUE(CloseToReference(c.params.at(name), values)) << name;
  }
  for (const std::string& dir : {first, second, third, tokens}) {
    std::filesystem::remove_all(dir);
  }
}

// zb-v puts the first and the last of its 2P stages on rank 0, so a tied
// lm_head sits beside its embedding: the tie is summed on the rank, and the
// job still ends equal to the reference, each copy equal to its original.
TEST(JobRunnerTest, ZeroBubbleVKeepsATiedEmbeddingOnOneRank) {
  const std::string tokens = TempDir("tied_v_tokens");
  WriteTokens(tokens);
  std::string yaml = TiedJobYaml(tokens + "/tokens.bin", 1);
  yaml = absl::StrReplaceAll(
      yaml, {{"    - boundary\n    - layernorm\n",
              "    - boundary\n    - transformer_block: {heads: 2, "
              "mlp_features: 16, causal: true}\n    - boundary\n    - "
              "layernorm\n"},
             {"schedule: 1f1b", "schedule: zb-v"}});
  const std::string dir = TempDir("tied_v");
  const std::vector<v1::JobProgram> programs = Programs(yaml, dir);
  ASSERT_EQ(programs.size(), 2u);
  std::vector<int> rank0;
  for (const v1::StageProgram& sp : programs[0].stages()) {
    rank0.push_back(sp.stage());
  }
  EXPECT_THAT(rank0, ::testing::ElementsAre(0, 3));
  JobRunnerOptions check;
  check.check_tied = true;
  const Result run = RunJob(programs, nullptr, {check, check});
  for (const absl::Status& s : run.statuses) ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(run.tied_copies.size(), 1u);
  EXPECT_EQ(run.tied_copies.at("layers.0.weight"),
            run.params.at("layers.0.weight"));
  const Result want = Reference(yaml);
  for (const auto& [name, values] : want.params) {
    EXPECT_TRUE(
        engine::testing_util::AllClose(run.params.at(name), values, 1e-5, 1e-6))
        << name;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(tokens);
}

TEST(JobRunnerTest, ACorruptOrMismatchedResumeFileIsRefused) {
  const std::string yaml = JobYaml({.steps = 2});
  const std::string dir = TempDir("corrupt");
  const Result first = RunJob(Programs(yaml, dir));
  for (const absl::Status& s : first.statuses) ASSERT_TRUE(s.ok()) << s;

  // The manifest's CRC no longer matches a flipped byte.
  std::vector<v1::JobProgram> programs = ResumePrograms(yaml, "", dir, 2);
  {
    const std::string path = checkpoint::StageFilePath(dir, 2, 0);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  absl::StatusOr<std::unique_ptr<JobRunner>> corrupt =
      JobRunner::Create(programs[0], {});
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("the file is corrupt"));

  // A size that differs.
  programs[1].mutable_resume_files(0)->set_bytes(
      programs[1].resume_files(0).bytes() + 1);
  absl::StatusOr<std::unique_ptr<JobRunner>> short_file =
      JobRunner::Create(programs[1], {});
  EXPECT_EQ(short_file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(short_file.status().message(),
              HasSubstr("bytes, but the checkpoint's manifest records"));

  // A name outside the step directory is never followed.
  programs[1].mutable_resume_files(0)->set_file("../stage-1.safetensors");
  EXPECT_EQ(JobRunner::Create(programs[1], {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

// Parameters are sized by the model: a rank whose parameters, gradients and
// Adam state cannot fit in this machine's memory (4 floats x 131072 x 131071
// weights = 256 GiB here, near the model-size limit) is refused before any
// is allocated, never left to the OOM killer.
TEST(JobRunnerTest, ParametersTooLargeForTheHostAreRefusedBeforeAllocating) {
  const uint64_t needed = uint64_t{16} * 131072 * 131071;
  if (const std::optional<uint64_t> available = AvailableHostMemoryBytes();
      !available.has_value() || *available >= needed) {
    GTEST_SKIP() << "this machine could hold 256 GiB of parameters";
  }
  const std::string yaml = R"(name: wide
model:
  input_shape: [131072]
  init: {seed: 0}
  layers:
    - dense: {features: 131071, bias: false}
    - boundary
    - dense: {features: 1, bias: false}
  loss: mse
data: {source: synthetic-regression}
training: {steps: 1, batch_size: 4, microbatches: 2}
optimizer: {kind: adam, lr: 0.1}
pipeline: {schedule: 1f1b}
)";
  const std::vector<v1::JobProgram> programs = Programs(yaml);
  ASSERT_EQ(programs.size(), 2u);
  absl::StatusOr<std::unique_ptr<JobRunner>> wide =
      JobRunner::Create(programs[0], {});
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(wide.status().message(),
              HasSubstr("rank 0's stages [0] with 17179738112 parameters (4 "
                        "floats each: values, gradients, optimizer state) "
                        "needs 256.0 GiB of host memory"));
  EXPECT_THAT(wide.status().message(), HasSubstr("cut it into more stages"));

  // With checkpoints, the background writer's host snapshot of the values
  // and Adam's state counts too.
  const std::string dir = TempDir("wide_snapshot");
  absl::StatusOr<std::unique_ptr<JobRunner>> snapshotted =
      JobRunner::Create(Programs(yaml, dir)[0], {});
  EXPECT_EQ(snapshotted.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(snapshotted.status().message(),
              HasSubstr("(7 floats each: values, gradients, optimizer state, "
                        "checkpoint snapshot) needs 448.0 GiB"));
}

// Activations are sized by the job too: a model of 2M parameters whose
// first layer outputs 64 x 2^20 floats per sample, at 1024 samples per
// microbatch, holds 256 GiB on rank 0 between forward and backward. It is
// refused before its first step, naming the sizes and what to change,
// instead of meeting std::bad_alloc or the OOM killer mid-step.
TEST(JobRunnerTest, ActivationsTooLargeForTheHostAreRefusedBeforeTheFirstStep) {
  const uint64_t needed = uint64_t{1024} * 64 * 1048576 * 4;
  if (const std::optional<uint64_t> available = AvailableHostMemoryBytes();
      !available.has_value() || *available >= needed) {
    GTEST_SKIP() << "this machine could hold 256 GiB of activations";
  }
  const std::string yaml = R"(name: wide-activations
model:
  input_shape: [64, 1]
  init: {seed: 0}
  layers:
    - dense: {features: 1048576}
    - boundary
    - dense: {features: 1}
  loss: mse
data: {source: synthetic-regression}
training: {steps: 1, batch_size: 1024, microbatches: 1}
optimizer: {kind: sgd, lr: 0.1}
pipeline: {schedule: 1f1b}
)";
  const std::vector<v1::JobProgram> programs = Programs(yaml);
  ASSERT_EQ(programs.size(), 2u);
  absl::StatusOr<std::unique_ptr<JobRunner>> wide =
      JobRunner::Create(programs[0], {});
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kResourceExhausted)
      << wide.status();
  EXPECT_THAT(wide.status().message(),
              HasSubstr("rank 0 (stage 0)'s activations (1 microbatch of "
                        "1024 samples in flight at the schedule's peak) needs "
                        "256.0 GiB of host memory"));
  EXPECT_THAT(wide.status().message(), HasSubstr("training.microbatches"));
  // The last stage keeps 64 floats per sample: it fits.
  EXPECT_TRUE(JobRunner::Create(programs[1], {}).ok());
}

// The first stage's own inputs count too: 4M floats a sample in a
// microbatch of 16384 is 256 GiB of input, with activations of 4 bytes a
// sample. It once passed, and the job died on rank 1's receive timeout.
TEST(JobRunnerTest, InputsTooLargeForTheHostAreRefusedBeforeTheFirstStep) {
  const uint64_t needed = uint64_t{16384} * 4194304 * 4;
  if (const std::optional<uint64_t> available = AvailableHostMemoryBytes();
      !available.has_value() || *available >= needed) {
    GTEST_SKIP() << "this machine could hold 256 GiB of inputs";
  }
  const std::string yaml = R"(name: wide-inputs
model:
  input_shape: [4194304]
  init: {seed: 0}
  layers:
    - dense: {features: 1}
    - boundary
    - dense: {features: 1}
  loss: mse
data: {source: synthetic-regression}
training: {steps: 1, batch_size: 16384, microbatches: 1}
optimizer: {kind: sgd, lr: 0.1}
pipeline: {schedule: 1f1b}
)";
  const std::vector<v1::JobProgram> programs = Programs(yaml);
  ASSERT_EQ(programs.size(), 2u);
  absl::StatusOr<std::unique_ptr<JobRunner>> first =
      JobRunner::Create(programs[0], {});
  EXPECT_EQ(first.status().code(), absl::StatusCode::kResourceExhausted)
      << first.status();
  EXPECT_THAT(first.status().message(),
              HasSubstr("rank 0 (stage 0)'s activations (1 microbatch of "
                        "16384 samples in flight at the schedule's peak) "
                        "needs 256.0 GiB of host memory"));
}

TEST(JobRunnerTest, CancelStopsBothRanksPromptly) {
  JobOptions o;
  o.steps = 100000;  // Far more than the test waits for.
  const std::vector<v1::JobProgram> programs = Programs(JobYaml(o));
  Clock::time_point cancelled_at;
  Clock::time_point ended_at;
  const Result got = RunJob(programs, [&](std::vector<JobRunner*>& runners) {
    cancelled_at = Clock::now();
    runners[1]->Cancel(absl::CancelledError("user asked"));
  });
  ended_at = Clock::now();
  EXPECT_LT(ended_at - cancelled_at, std::chrono::seconds(2));
  ASSERT_EQ(got.statuses.size(), 2u);
  // The cancelled rank reports the cancel itself; its peer learns it over
  // the data plane, with the same code and reason.
  EXPECT_EQ(got.statuses[1], absl::CancelledError("user asked"));
  EXPECT_EQ(got.statuses[0].code(), absl::StatusCode::kCancelled)
      << got.statuses[0];
  EXPECT_THAT(got.statuses[0].message(), HasSubstr("user asked"));
  EXPECT_LT(got.losses.size(), 100000u);
}

// A cancel must not wait out a long layer: stage 0's `delay` of a minute (a
// stand-in for any long compute that receives nothing) ends at the cancel.
// Before the fix the cancelled rank slept its minute (56.7 s measured), its
// peer stopped at once. Only rank 0, the one in the wait, is cancelled.
TEST(JobRunnerTest, CancelEndsALongLayerPromptly) {
  const std::string yaml = R"(name: long-layer
model:
  input_shape: [2]
  init: {seed: 0}
  layers:
    - delay: {forward_ms: 60000, backward_ms: 0}
    - boundary
    - dense: {features: 1}
  loss: mse
data: {source: synthetic-regression}
training: {steps: 10, batch_size: 2, microbatches: 2}
optimizer: {kind: sgd, lr: 0.1}
pipeline: {schedule: 1f1b}
)";
  const std::vector<v1::JobProgram> programs = Programs(yaml);
  ASSERT_EQ(programs.size(), 2u);
  std::vector<std::unique_ptr<JobRunner>> runners;
  std::vector<std::string> peers;
  for (const v1::JobProgram& p : programs) {
    absl::StatusOr<std::unique_ptr<JobRunner>> r = JobRunner::Create(p, {});
    ASSERT_TRUE(r.ok()) << r.status();
    peers.push_back((*r)->data_endpoint());
    runners.push_back(*std::move(r));
  }
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      statuses[r] = runners[r]->Start(peers);
      if (statuses[r].ok()) statuses[r] = runners[r]->Run(nullptr);
    });
  }
  // Both ranks are in the first step by now: rank 0 in the delay, rank 1
  // waiting for its activation.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const Clock::time_point cancelled_at = Clock::now();
  runners[0]->Cancel(absl::CancelledError("user asked"));
  for (auto& t : threads) t.join();
  // A liveness bound: the README's two seconds, against a minute.
  EXPECT_LT(Clock::now() - cancelled_at, std::chrono::seconds(2));
  EXPECT_EQ(statuses[0], absl::CancelledError("user asked"));
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kCancelled) << statuses[1];
  EXPECT_EQ(runners[0]->steps_done(), 0);
}

// Preparation stops at a cancel too: Create on a thread whose job is
// cancelled returns the cancel, whatever the parameters' source.
TEST(JobRunnerTest, CreateStopsWhenTheJobIsCancelled) {
  Cancellation cancellation;
  cancellation.Cancel(absl::CancelledError("cancelled while preparing"));
  CancellationScope scope(&cancellation);
  const std::vector<v1::JobProgram> programs = Programs(JobYaml({}));
  EXPECT_EQ(JobRunner::Create(programs[0], {}).status(),
            absl::CancelledError("cancelled while preparing"));
}

// A coordinator that puts a CPU job on NCCL (a skewed or buggy one): every
// rank refuses at Start, naming why, instead of waiting for an id.
TEST(JobRunnerTest, NcclWithoutAGpuFailsStartOnEveryRank) {
  const std::vector<v1::JobProgram> programs = Programs(JobYaml({}));
  std::vector<std::unique_ptr<JobRunner>> runners;
  std::vector<std::string> peers;
  for (const v1::JobProgram& p : programs) {
    auto runner = JobRunner::Create(p, {});
    ASSERT_TRUE(runner.ok()) << runner.status();
    EXPECT_FALSE((*runner)->nccl());
    EXPECT_EQ((*runner)->device_uuid(), "");
    peers.push_back((*runner)->data_endpoint());
    runners.push_back(*std::move(runner));
  }
  std::vector<absl::Status> statuses(runners.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < runners.size(); ++r) {
    threads.emplace_back(
        [&, r] { statuses[r] = runners[r]->Start(peers, /*nccl=*/true); });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) {
    EXPECT_FALSE(s.ok());
  }
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(statuses[0].message(), HasSubstr("cannot use NCCL"));
}

TEST(JobRunnerTest, PipelinePeersAreTheNeighboursUnderThePlacementAndTies) {
  using scheduler::Placement;
  using ::testing::ElementsAre;
  const std::vector<engine::TiedParameter> none;
  const std::vector<engine::TiedParameter> ends = {
      {.name = "layers.0.weight", .original_stage = 0, .copy_stage = 7}};
  EXPECT_THAT(PipelinePeers(Placement::kLoop, 0, 1, 1, none), ElementsAre());
  EXPECT_THAT(PipelinePeers(Placement::kLoop, 0, 2, 2, none), ElementsAre(1));
  EXPECT_THAT(PipelinePeers(Placement::kLoop, 1, 2, 4, none), ElementsAre(0));
  EXPECT_THAT(PipelinePeers(Placement::kLoop, 0, 4, 4, none), ElementsAre(1));
  EXPECT_THAT(PipelinePeers(Placement::kLoop, 2, 4, 4, none),
              ElementsAre(1, 3));
  EXPECT_THAT(PipelinePeers(Placement::kLoop, 3, 4, 4, none), ElementsAre(2));
  // Virtual stages close the ring: stage 3 on rank 3 feeds stage 4 on rank 0.
  EXPECT_THAT(PipelinePeers(Placement::kLoop, 0, 4, 8, none),
              ElementsAre(1, 3));
  EXPECT_THAT(PipelinePeers(Placement::kLoop, 3, 4, 8, none),
              ElementsAre(0, 2));
  // So does a tie between the first and the last stage, one rank a stage.
  const std::vector<engine::TiedParameter> ends4 = {
      {.name = "layers.0.weight", .original_stage = 0, .copy_stage = 3}};
  EXPECT_THAT(PipelinePeers(Placement::kLoop, 0, 4, 4, ends4),
              ElementsAre(1, 3));
  // V-shaped, both ends are on rank 0: no ring, tied or not.
  EXPECT_THAT(PipelinePeers(Placement::kV, 0, 4, 8, ends), ElementsAre(1));
  EXPECT_THAT(PipelinePeers(Placement::kV, 3, 4, 8, ends), ElementsAre(2));
  // Symmetric, as the NCCL channel's rounds need.
  for (Placement placement : {Placement::kLoop, Placement::kV}) {
    for (int p = 1; p <= 5; ++p) {
      for (int v = 1; v <= 3; ++v) {
        std::vector<engine::TiedParameter> tied = {
            {.name = "w", .original_stage = 0, .copy_stage = p * v - 1}};
        for (int r = 0; r < p; ++r) {
          for (int q : PipelinePeers(placement, r, p, p * v, tied)) {
            EXPECT_THAT(PipelinePeers(placement, q, p, p * v, tied),
                        ::testing::Contains(r))
                << r << " -> " << q << " of " << p << " V=" << v;
          }
        }
      }
    }
  }
}

TEST(JobRunnerTest, CancelBeforeStartFailsStart) {
  const std::vector<v1::JobProgram> programs = Programs(JobYaml({}));
  auto runner = JobRunner::Create(programs[0], {});
  ASSERT_TRUE(runner.ok()) << runner.status();
  (*runner)->Cancel(absl::CancelledError("never mind"));
  // Rank 1 does not exist: without the cancel this would dial for 10 s.
  const Clock::time_point start = Clock::now();
  EXPECT_EQ((*runner)->Start({(*runner)->data_endpoint(), "127.0.0.1:1"}),
            absl::CancelledError("never mind"));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
}

// A rank whose step fails aborts the job with its reason, so its peer stops
// with that reason at once instead of waiting out its receive timeout.
TEST(JobRunnerTest, AFailingRankStopsItsPeerWithItsReason) {
  std::vector<v1::JobProgram> programs = Programs(JobYaml({}));
  // Rank 1 (the last stage) loses its final backward: its step ends with a
  // microbatch still in flight, and rank 0 never gets that gradient.
  std::vector<JobRunnerOptions> options(2);
  options[1].TEST_drop_last_actions = 1;
  programs[0].set_recv_timeout_ms(60000);
  const Clock::time_point start = Clock::now();
  const Result got = RunJob(programs, nullptr, options);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  ASSERT_EQ(got.statuses.size(), 2u);
  EXPECT_EQ(got.statuses[1].code(), absl::StatusCode::kInternal)
      << got.statuses[1];
  EXPECT_THAT(got.statuses[1].message(), HasSubstr("still holds"));
  EXPECT_FALSE(got.statuses[0].ok());
  EXPECT_THAT(got.statuses[0].message(), HasSubstr("still holds"));
}

TEST(JobRunnerTest, RefusesProgramWhoseParameterNamesDisagree) {
  std::vector<v1::JobProgram> programs = Programs(JobYaml({}));
  programs[1].mutable_stages(0)->set_parameter_names(0, "layers.2.kernel");
  auto runner = JobRunner::Create(programs[1], {});
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(runner.status().message(),
              HasSubstr("program/build mismatch: the program differs from "
                        "this build's plan: modified: "
                        "stages[0].parameter_names[0]"));
  EXPECT_THAT(runner.status().message(), HasSubstr("layers.2.kernel"));
}

// Regression: a pre-norm block builds norm1 before its attention, while
// the spec lists the attention's parameters first. Same names, other order:
// not a mismatch (examples/gpt.yaml was refused for it).
TEST(JobRunnerTest, AcceptsTheSameParametersInAnotherOrder) {
  const std::string yaml =
      "name: prenorm\nmodel:\n  input_shape: [4, 8]\n  init: {seed: 1}\n"
      "  layers:\n    - transformer_block: {heads: 2, mlp_features: 16, "
      "norm: pre}\n    - boundary\n    - dense: {features: 8}\n"
      "  loss: mse\ndata: {source: synthetic-regression}\n"
      "training: {steps: 1, batch_size: 4, microbatches: 2}\n"
      "optimizer: {kind: sgd, lr: 0.1}\n";
  std::vector<v1::JobProgram> programs = Programs(yaml);
  ASSERT_EQ(programs.size(), 2u);
  auto runner = JobRunner::Create(programs[0], {});
  EXPECT_TRUE(runner.ok()) << runner.status();
}

TEST(JobRunnerTest, RefusesProgramWhoseLayersOrStagesDisagree) {
  std::vector<v1::JobProgram> programs = Programs(JobYaml({}));
  v1::JobProgram layers = programs[1];
  layers.mutable_stages(0)->set_num_layers(2);
  EXPECT_THAT(JobRunner::Create(layers, {}).status().message(),
              HasSubstr("program/build mismatch: the program differs from "
                        "this build's plan: modified: stages[0].num_layers: "
                        "3 -> 2"));
  EXPECT_EQ(JobRunner::Create(layers, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);

  v1::JobProgram stages = programs[1];
  stages.mutable_stages(0)->set_stage(0);
  EXPECT_EQ(JobRunner::Create(stages, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);

  v1::JobProgram count = programs[0];
  count.set_num_stages(4);
  count.set_num_ranks(4);
  EXPECT_EQ(JobRunner::Create(count, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(JobRunnerTest, RejectsInconsistentPrograms) {
  v1::JobProgram p = Programs(JobYaml({}))[0];
  p.set_rank(2);
  EXPECT_EQ(JobRunner::Create(p, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  p = Programs(JobYaml({}))[0];
  p.set_yaml("model: [");
  EXPECT_EQ(JobRunner::Create(p, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  p = Programs(JobYaml({}))[0];
  p.set_secret("");
  EXPECT_EQ(JobRunner::Create(p, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(JobRunnerTest, DescribesRankAndStages) {
  const std::vector<v1::JobProgram> programs = Programs(JobYaml(
      {.schedule = "interleaved-1f1b", .stages = 4, .virtual_stages = 2}));
  EXPECT_EQ(DescribeRank(programs[0]), "rank 0 (stages 0, 2)");
  EXPECT_EQ(DescribeRank(programs[1]), "rank 1 (stages 1, 3)");
}

}  // namespace
}  // namespace conveyor::worker
