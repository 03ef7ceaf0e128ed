#include "job/job_spec.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "engine/data.h"
#include "engine/model_spec.h"
#include "engine/optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::job {

using engine::DataConfig;
using engine::LayerKind;
using engine::LossKind;
using engine::LrSchedule;
using engine::OptimizerConfig;
using engine::Precision;
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

// A job whose sections sit on fixed lines, so that errors in them have known
// positions: the model fills lines 1-5, then data is on line 6, training on
// line 7, optimizer on line 8, and `extra` starts on line 9.
struct Sections {
  std::string data = "{source: synthetic-regression}";
  std::string training = "{steps: 10, batch_size: 8, microbatches: 2}";
  std::string optimizer = "{kind: adam}";
  std::string extra = "";
};

std::string Job(const Sections& s) {
  return absl::StrCat(
      "model:\n"
      "  input_shape: [4]\n"
      "  init: {seed: 0}\n"
      "  loss: mse\n"
      "  layers: [{dense: {features: 2}}]\n",
      "data: ", s.data, "\n", "training: ", s.training, "\n",
      "optimizer: ", s.optimizer, "\n", s.extra);
}

JobSpec ParseOk(const std::string& yaml, absl::string_view file = "job.yaml",
                absl::string_view base_dir = "") {
  absl::StatusOr<JobSpec> job = ParseJobSpec(yaml, file, base_dir);
  EXPECT_TRUE(job.ok()) << job.status() << "\n" << yaml;
  return job.ok() ? *std::move(job) : JobSpec{};
}

// The message of the InvalidArgument that parsing `yaml` must return.
std::string ParseError(const std::string& yaml,
                       absl::string_view file = "job.yaml") {
  absl::StatusOr<JobSpec> job = ParseJobSpec(yaml, file);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument)
      << job.status() << "\n"
      << yaml;
  return std::string(job.status().message());
}

// A fresh directory under the test's temp dir.
std::filesystem::path MakeTempDir(absl::string_view name) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat("job_spec_test_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

TEST(JobSpecTest, FullJobParsesEveryField) {
  const JobSpec job = ParseOk(R"(name: gpt-small
model:
  input_shape: [16]
  init: {from: init.safetensors}
  layers:
    - embedding: {vocab_size: 256, features: 8}
    - boundary
    - lm_head: {vocab_size: 256}
  loss: cross_entropy
data:
  source: tokens
  seed: 7
  path: data/train.bin
  shuffle: true
  seq_len: 16
  uint16: true
  vocab_size: 200
training: {steps: 100, batch_size: 64, microbatches: 4}
optimizer:
  kind: adamw
  lr: 1e-3
  betas: [0.8, 0.95]
  eps: 1.0e-8
  weight_decay: 0.1
  clip_grad_norm: 1.0
  schedule: {kind: cosine, warmup_steps: 10, total_steps: 90, min_lr: 1e-5}
pipeline: {schedule: interleaved-1f1b, virtual_stages: 2}
checkpoint: {dir: out/gpt, every: 25, keep_latest: 3}
)");
  EXPECT_EQ(job.name, "gpt-small");

  EXPECT_EQ(job.model.num_stages, 2);
  ASSERT_EQ(job.model.layers.size(), 2u);
  EXPECT_EQ(job.model.layers[1].kind, LayerKind::kLmHead);
  EXPECT_TRUE(job.model.token_input);
  EXPECT_EQ(job.model.loss, LossKind::kCrossEntropy);
  EXPECT_EQ(job.model.init_from, "init.safetensors");  // no base_dir

  EXPECT_EQ(job.data.kind, DataConfig::Kind::kTokens);
  EXPECT_EQ(job.data.seed, 7u);
  EXPECT_EQ(job.data.path, "data/train.bin");
  EXPECT_TRUE(job.data.shuffle);
  EXPECT_EQ(job.data.seq_len, 16);
  EXPECT_EQ(job.data.token_dtype, engine::TokenDType::kUint16);
  EXPECT_EQ(job.data.vocab_size, 200);

  EXPECT_EQ(job.training.steps, 100);
  EXPECT_EQ(job.training.batch_size, 64);
  EXPECT_EQ(job.training.microbatches, 4);

  EXPECT_EQ(job.optimizer.kind, OptimizerConfig::Kind::kAdamW);
  EXPECT_DOUBLE_EQ(job.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(job.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(job.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(job.optimizer.eps, 1e-8);
  EXPECT_THAT(job.optimizer.weight_decay, Optional(0.1));
  EXPECT_THAT(job.optimizer.clip_grad_norm, Optional(1.0));
  EXPECT_EQ(job.optimizer.schedule.kind, LrSchedule::Kind::kCosine);
  EXPECT_EQ(job.optimizer.schedule.warmup_steps, 10);
  EXPECT_EQ(job.optimizer.schedule.total_steps, 90);
  EXPECT_DOUBLE_EQ(job.optimizer.schedule.min_lr, 1e-5);

  EXPECT_EQ(job.pipeline.schedule, "interleaved-1f1b");
  EXPECT_EQ(job.pipeline.virtual_stages, 2);
  EXPECT_EQ(job.pipeline.where.ToString(), "job.yaml:27:22");

  EXPECT_EQ(job.checkpoint.dir, "out/gpt");
  EXPECT_EQ(job.checkpoint.every, 25);
  EXPECT_EQ(job.checkpoint.keep_latest, 3);
}

TEST(JobSpecTest, SgdAndSyntheticRegressionFields) {
  const JobSpec job = ParseOk(
      Job({.data = "{source: synthetic-regression, seed: 3, noise: 0.5, "
                   "num_samples: 1000, shuffle: true}",
           .optimizer = "{kind: sgd, lr: 0.1, momentum: 0.9, nesterov: true, "
                        "dampening: 0, weight_decay: 0, schedule: {kind: "
                        "linear-warmup, warmup_steps: 5}}"}));
  EXPECT_EQ(job.data.kind, DataConfig::Kind::kSyntheticRegression);
  EXPECT_EQ(job.data.seed, 3u);
  EXPECT_DOUBLE_EQ(job.data.noise, 0.5);
  EXPECT_EQ(job.data.num_samples, 1000);
  EXPECT_TRUE(job.data.shuffle);
  EXPECT_TRUE(job.data.path.empty());

  EXPECT_EQ(job.optimizer.kind, OptimizerConfig::Kind::kSgd);
  EXPECT_DOUBLE_EQ(job.optimizer.lr, 0.1);
  EXPECT_DOUBLE_EQ(job.optimizer.momentum, 0.9);
  EXPECT_TRUE(job.optimizer.nesterov);
  EXPECT_DOUBLE_EQ(job.optimizer.dampening, 0.0);
  // Given explicitly, so set even though it equals sgd's default.
  EXPECT_THAT(job.optimizer.weight_decay, Optional(0.0));
  EXPECT_EQ(job.optimizer.schedule.kind, LrSchedule::Kind::kLinearWarmup);
  EXPECT_EQ(job.optimizer.schedule.warmup_steps, 5);
}

TEST(JobSpecTest, TensorsSource) {
  const JobSpec job =
      ParseOk(Job({.data = "{source: tensors, path: /abs/xy.safetensors}"}));
  EXPECT_EQ(job.data.kind, DataConfig::Kind::kTensors);
  EXPECT_EQ(job.data.path, "/abs/xy.safetensors");
}

TEST(JobSpecTest, OmittedFieldsTakeTheirDefaults) {
  const JobSpec job = ParseOk(Job({.training = "{steps: 3, batch_size: 5}"}));
  EXPECT_EQ(job.name, "job");  // the stem of job.yaml

  const DataConfig data_defaults;
  EXPECT_EQ(job.data.kind, DataConfig::Kind::kSyntheticRegression);
  EXPECT_EQ(job.data.seed, 0u);
  EXPECT_FALSE(job.data.shuffle);
  EXPECT_DOUBLE_EQ(job.data.noise, data_defaults.noise);
  EXPECT_EQ(job.data.num_samples, 0);

  EXPECT_EQ(job.training.steps, 3);
  EXPECT_EQ(job.training.batch_size, 5);
  EXPECT_EQ(job.training.microbatches, 1);
  EXPECT_EQ(job.training.precision, Precision::kFp32);

  const OptimizerConfig opt_defaults;
  EXPECT_EQ(job.optimizer.kind, OptimizerConfig::Kind::kAdam);
  EXPECT_DOUBLE_EQ(job.optimizer.lr, opt_defaults.lr);
  EXPECT_DOUBLE_EQ(job.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(job.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(job.optimizer.eps, 1e-8);
  EXPECT_EQ(job.optimizer.weight_decay, std::nullopt);
  EXPECT_EQ(job.optimizer.clip_grad_norm, std::nullopt);
  EXPECT_EQ(job.optimizer.schedule.kind, LrSchedule::Kind::kConstant);

  EXPECT_EQ(job.pipeline.schedule, "1f1b");
  EXPECT_EQ(job.pipeline.virtual_stages, 1);
  // No pipeline section: the planner's errors name the file only.
  EXPECT_EQ(job.pipeline.where.ToString(), "job.yaml");

  EXPECT_TRUE(job.checkpoint.dir.empty());
  EXPECT_EQ(job.checkpoint.every, 0);
  EXPECT_EQ(job.checkpoint.keep_latest, 0);
}

TEST(JobSpecTest, NameDefaultsToFileStemOrJob) {
  EXPECT_EQ(ParseOk(Job({}), "configs/mlp.yaml").name, "mlp");
  EXPECT_EQ(ParseOk(Job({}), "").name, "job");
  EXPECT_EQ(ParseOk(Job({.extra = "name: 42\n"}), "x.yaml").name, "42");
}

// Names with ESC, NUL, DEL or \x01 were printed raw by `jobs`, `status` and
// the coordinator's log: they are refused like worker names.
TEST(JobSpecTest, NamesWithControlCharactersAreRefused) {
  for (const char* name : {"\"evil\\e[2Jname\"", "\"nul\\0x\"", "\"del\\x7f\"",
                           "\"a\\x01b\"", "\"tab\\tname\""}) {
    const std::string error = ParseError(
        Job({.extra = absl::StrCat("name: ", name, "\n")}), "j.yaml");
    EXPECT_THAT(error, HasSubstr("name: must be 1 to 253 bytes without control "
                                 "characters"))
        << name;
    EXPECT_THAT(error, ::testing::StartsWith("j.yaml:")) << name;
  }
  EXPECT_THAT(ParseError(Job({.extra = "name: \"evil\\e[2J\"\n"}), "j.yaml"),
              HasSubstr("got \"evil\\x1b[2J\""));
  EXPECT_THAT(
      ParseError(
          Job({.extra = absl::StrCat("name: ", std::string(300, 'n'), "\n")}),
          "j.yaml"),
      HasSubstr("must be 1 to 253 bytes"));
  // Unicode is text, not control: kept.
  EXPECT_EQ(ParseOk(Job({.extra = "name: \"caf\u00e9\"\n"}), "x.yaml").name,
            "caf\xc3\xa9");
  // A file's name holding one gives an escaped default.
  EXPECT_EQ(ParseOk(Job({}), "a\x1b[2Jb.yaml").name, "a\\x1b[2Jb");
}

TEST(JobSpecTest, TextWithoutFileLabelsErrors) {
  EXPECT_EQ(ParseError(Job({.training = "{steps: 0, batch_size: 8}"}), ""),
            "<job>:7:19: training.steps: must be a positive integer; got '0'");
}

TEST(JobSpecTest, PipelineWhereFallsBackToTheSection) {
  const JobSpec job =
      ParseOk(Job({.extra = "pipeline: {virtual_stages: 3}\n"}));
  EXPECT_EQ(job.pipeline.schedule, "1f1b");
  EXPECT_EQ(job.pipeline.virtual_stages, 3);
  EXPECT_EQ(job.pipeline.where.ToString(), "job.yaml:9:11");
}

TEST(JobSpecTest, CosineTotalStepsDefaultsToTrainingSteps) {
  JobSpec job = ParseOk(
      Job({.optimizer = "{kind: adam, schedule: {kind: cosine, warmup_steps: "
                        "2}}"}));
  EXPECT_EQ(job.optimizer.schedule.kind, LrSchedule::Kind::kCosine);
  EXPECT_EQ(job.optimizer.schedule.warmup_steps, 2);
  // Left at 0 ("training.steps") so that a later --steps override still
  // decays over the whole run; ResolveSchedule fills it in.
  EXPECT_EQ(job.optimizer.schedule.total_steps, 0);
  ResolveSchedule(job.optimizer, job.training.steps);
  EXPECT_EQ(job.optimizer.schedule.total_steps, 10);
  ResolveSchedule(job.optimizer, 50);  // Already resolved: unchanged.
  EXPECT_EQ(job.optimizer.schedule.total_steps, 10);
  EXPECT_DOUBLE_EQ(job.optimizer.schedule.min_lr, 0.0);
}

TEST(JobSpecTest, RelativePathsResolveAgainstBaseDir) {
  const std::string yaml = R"(model:
  input_shape: [4]
  init: {from: ../weights/init.safetensors}
  layers: [{dense: {features: 2}}]
  loss: mse
data: {source: tensors, path: data/xy.safetensors}
training: {steps: 1, batch_size: 1}
optimizer: {kind: sgd}
checkpoint: {dir: out}
)";
  const JobSpec job = ParseOk(yaml, "jobs/j.yaml", "/srv/jobs");
  EXPECT_EQ(job.model.init_from, "/srv/jobs/../weights/init.safetensors");
  EXPECT_EQ(job.data.path, "/srv/jobs/data/xy.safetensors");
  EXPECT_EQ(job.checkpoint.dir, "/srv/jobs/out");

  // Without a base dir the paths stay as written.
  const JobSpec plain = ParseOk(yaml, "jobs/j.yaml");
  EXPECT_EQ(plain.model.init_from, "../weights/init.safetensors");
  EXPECT_EQ(plain.data.path, "data/xy.safetensors");
  EXPECT_EQ(plain.checkpoint.dir, "out");
}

TEST(JobSpecTest, AbsolutePathsAreKept) {
  const JobSpec job =
      ParseOk(Job({.data = "{source: tensors, path: /data/xy.safetensors}",
                   .extra = "checkpoint: {dir: /ckpt}\n"}),
              "job.yaml", "/base");
  EXPECT_EQ(job.data.path, "/data/xy.safetensors");
  EXPECT_EQ(job.checkpoint.dir, "/ckpt");
}

TEST(JobSpecTest, LoadJobSpecReadsFileAndResolvesAgainstItsDirectory) {
  const std::filesystem::path dir = MakeTempDir("load") / "sub";
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / "mlp.yaml";
  WriteFile(path, Job({.data = "{source: tensors, path: xy.safetensors}",
                       .extra = "checkpoint: {dir: ckpt, every: 5}\n"}));
  absl::StatusOr<JobSpec> job = LoadJobSpec(path.string());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name, "mlp");
  EXPECT_EQ(job->data.path, (dir / "xy.safetensors").string());
  EXPECT_EQ(job->checkpoint.dir, (dir / "ckpt").string());
  EXPECT_EQ(job->checkpoint.every, 5);
  EXPECT_EQ(job->training.steps, 10);
}

TEST(JobSpecTest, LoadJobSpecErrorsNameTheFile) {
  const std::filesystem::path path = MakeTempDir("load_error") / "bad.yaml";
  WriteFile(path, Job({.training = "{steps: -2, batch_size: 8}"}));
  absl::StatusOr<JobSpec> job = LoadJobSpec(path.string());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(),
            absl::StrCat(path.string(),
                         ":7:19: training.steps: must be a positive integer; "
                         "got '-2'"));
}

TEST(JobSpecTest, LoadJobSpecMissingFileIsNotFound) {
  const std::string path =
      (MakeTempDir("missing") / "no_such_job.yaml").string();
  absl::StatusOr<JobSpec> job = LoadJobSpec(path);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(job.status().message(), HasSubstr(path));
}

TEST(JobSpecTest, LoadJobSpecRejectsFilesOverTheLimit) {
  const std::filesystem::path dir = MakeTempDir("big");
  // Exactly at the limit: accepted.
  std::string at_limit = Job({});
  at_limit.append(kMaxJobFileBytes - at_limit.size(), '\n');
  WriteFile(dir / "at.yaml", at_limit);
  EXPECT_TRUE(LoadJobSpec((dir / "at.yaml").string()).ok());

  WriteFile(dir / "over.yaml", at_limit + "\n");
  absl::StatusOr<JobSpec> job = LoadJobSpec((dir / "over.yaml").string());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("over.yaml"));
  EXPECT_THAT(job.status().message(),
              HasSubstr(absl::StrCat("limit of ", kMaxJobFileBytes, " bytes")));
}

TEST(JobSpecTest, LoadJobSpecRejectsADirectory) {
  const std::filesystem::path dir = MakeTempDir("dir");
  absl::StatusOr<JobSpec> job = LoadJobSpec(dir.string());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("not a regular file"));
}

// ---- Errors: each names file:line:col and the YAML path. ----

TEST(JobSpecErrorTest, YamlSyntax) {
  EXPECT_THAT(
      ParseError(Job({.training = "{steps: 1, batch_size: 2"})),
      HasSubstr("job.yaml:8:10: YAML syntax error: end of map flow not found"));
}

TEST(JobSpecErrorTest, SecondDocument) {
  EXPECT_THAT(ParseError(Job({.extra = "---\nname: other\n"})),
              HasSubstr("job.yaml:10:1: expected one YAML document; found 2"));
}

TEST(JobSpecErrorTest, TopLevelMustBeAMap) {
  EXPECT_EQ(ParseError("- a\n- b\n"),
            "job.yaml:1:1: (top level): must be a map; got a list");
  EXPECT_EQ(ParseError(""),
            "job.yaml:1:1: (top level): must be a map; got null");
}

TEST(JobSpecErrorTest, UnknownTopLevelKeyListsAllowed) {
  EXPECT_EQ(ParseError(Job({.extra = "optimiser: {}\n"})),
            "job.yaml:9:1: (top level): unknown key 'optimiser'; allowed: "
            "name, model, data, training, optimizer, pipeline, checkpoint, "
            "resume, restart, eval, priority, owner");
}

TEST(JobSpecTest, PriorityAndOwnerDefaultToNormalAndNone) {
  const JobSpec job = ParseOk(Job({}));
  EXPECT_EQ(job.priority, kPriorityNormal);
  EXPECT_EQ(job.owner, "");
}

TEST(JobSpecTest, PriorityTakesClassesAndIntegers) {
  const std::pair<const char*, int> cases[] = {
      {"low", 0}, {"normal", 100}, {"high", 200}, {"urgent", 300},
      {"0", 0},   {"150", 150},    {"1000", 1000}};
  for (const auto& [text, number] : cases) {
    const JobSpec job = ParseOk(
        Job({.extra = absl::StrCat("priority: ", text, "\nowner: team-a\n")}));
    EXPECT_EQ(job.priority, number) << text;
    EXPECT_EQ(job.owner, "team-a");
  }
  EXPECT_EQ(PriorityName(200), "high");
  EXPECT_EQ(PriorityName(150), "150");
  EXPECT_EQ(PriorityName(1000), "1000");
}

TEST(JobSpecErrorTest, BadPriorityListsTheAllowedValues) {
  const std::string allowed =
      "must be one of low, normal, high, urgent (0, 100, 200, 300) or an "
      "integer in [0, 1000]";
  EXPECT_EQ(
      ParseError(Job({.extra = "priority: critical\n"})),
      absl::StrCat("job.yaml:9:11: priority: ", allowed, "; got \"critical\""));
  EXPECT_EQ(ParseError(Job({.extra = "priority: -5\n"})),
            absl::StrCat("job.yaml:9:11: priority: ", allowed, "; got \"-5\""));
  EXPECT_EQ(
      ParseError(Job({.extra = "priority: 1001\n"})),
      absl::StrCat("job.yaml:9:11: priority: ", allowed, "; got \"1001\""));
  EXPECT_EQ(
      ParseError(Job({.extra = "priority: High\n"})),
      absl::StrCat("job.yaml:9:11: priority: ", allowed, "; got \"High\""));
  EXPECT_EQ(ParseError(Job({.extra = "priority: [1]\n"})),
            absl::StrCat("job.yaml:9:11: priority: ", allowed, "; got a list"));
}

TEST(JobSpecErrorTest, BadOwnerSaysWhatAnOwnerHolds) {
  const std::string allowed = "must be 1 to 64 characters of A-Z a-z 0-9 . _ -";
  EXPECT_EQ(ParseError(Job({.extra = "owner: team=a\n"})),
            absl::StrCat("job.yaml:9:8: owner: ", allowed, "; got \"team=a\""));
  EXPECT_EQ(ParseError(Job({.extra = "owner: \"a,b\"\n"})),
            absl::StrCat("job.yaml:9:8: owner: ", allowed, "; got \"a,b\""));
  EXPECT_EQ(ParseError(Job({.extra = "owner: {team: a}\n"})),
            absl::StrCat("job.yaml:9:8: owner: ", allowed, "; got a map"));
  EXPECT_THAT(ParseError(Job({.extra = absl::StrCat(
                                  "owner: ", std::string(65, 'a'), "\n")})),
              HasSubstr(allowed));
}

TEST(JobSpecTest, EvalSectionParses) {
  const JobSpec job = ParseOk(
      Job({.extra = "eval:\n  every: 5\n  batches: 3\n"
                    "  data: {source: synthetic-regression, seed: 7}\n"}),
      "job.yaml", "/base");
  EXPECT_TRUE(job.eval.enabled);
  EXPECT_EQ(job.eval.every, 5);
  EXPECT_EQ(job.eval.batches, 3);
  EXPECT_EQ(job.eval.data.seed, 7u);
  EXPECT_EQ(job.eval.where.ToString(), "job.yaml:10:3");
  // Due after every 5th step and after the last (10 steps: 5 and 10).
  std::vector<int64_t> due;
  for (int64_t done = 1; done <= 12; ++done) {
    if (job.eval.DueAfter(done, 12)) due.push_back(done);
  }
  EXPECT_THAT(due, ::testing::ElementsAre(5, 10, 12));
  // every: 0 (the default) evaluates only after the last step; batches
  // defaults to 1; a job without the section never evaluates.
  const JobSpec end_only =
      ParseOk(Job({.extra = "eval: {data: {source: synthetic-regression}}\n"}));
  EXPECT_EQ(end_only.eval.every, 0);
  EXPECT_EQ(end_only.eval.batches, 1);
  EXPECT_FALSE(end_only.eval.DueAfter(5, 10));
  EXPECT_TRUE(end_only.eval.DueAfter(10, 10));
  EXPECT_FALSE(ParseOk(Job({})).eval.DueAfter(10, 10));
}

TEST(JobSpecErrorTest, EvalErrorsNameTheFieldAndTheRule) {
  EXPECT_EQ(ParseError(Job({.extra = "eval: {every: 5}\n"})),
            "job.yaml:9:7: eval: missing required key 'data'");
  EXPECT_EQ(ParseError(Job({.extra = "eval: {data: {source: synthetic-"
                                     "regression}, batch: 2}\n"})),
            "job.yaml:9:46: eval: unknown key 'batch'; allowed: every, "
            "batches, data");
  EXPECT_EQ(ParseError(Job({.extra = "eval: {data: {source: synthetic-"
                                     "regression}, batches: 0}\n"})),
            "job.yaml:9:55: eval.batches: must be a positive integer; got '0'");
  EXPECT_EQ(ParseError(Job({.extra = "eval: {data: {source: synthetic-"
                                     "regression}, every: -1}\n"})),
            "job.yaml:9:53: eval.every: must be a non-negative integer; got "
            "'-1'");
  // K * M forwards in one schedule: bounded as training's microbatches are.
  EXPECT_EQ(ParseError(Job({.extra = "eval: {data: {source: synthetic-"
                                     "regression}, batches: 600000}\n"})),
            "job.yaml:9:55: eval.batches: batches * training.microbatches "
            "(600000 * 2) must be at most 1048576");
  // The validation data must fit the model as the training data must.
  EXPECT_THAT(ParseError(Job({.extra = "eval: {data: {source: tokens, path: "
                                       "v.bin, seq_len: 4}}\n"})),
              HasSubstr("job.yaml:9:14: eval.data: "));
  EXPECT_THAT(ParseError(Job({.extra = "eval: {data: {source: nope}}\n"})),
              HasSubstr("eval.data.source: "));
}

TEST(JobSpecErrorTest, DuplicateTopLevelKey) {
  EXPECT_EQ(ParseError(Job({.extra = "training: {steps: 2, batch_size: 2}\n"})),
            "job.yaml:9:1: (top level): duplicate key 'training'");
}

TEST(JobSpecErrorTest, MissingRequiredSections) {
  const std::string job = Job({});
  for (absl::string_view section : {"data", "training", "optimizer"}) {
    // Drop the section's line.
    std::string yaml = job;
    const size_t begin = yaml.find(absl::StrCat("\n", section, ":")) + 1;
    yaml.erase(begin, yaml.find('\n', begin) + 1 - begin);
    EXPECT_EQ(ParseError(yaml),
              absl::StrCat("job.yaml:1:1: (top level): missing required key '",
                           section, "'"));
  }
  EXPECT_EQ(ParseError("data: {source: tensors}\n"),
            "job.yaml:1:1: (top level): missing required key 'model'");
}

TEST(JobSpecErrorTest, SectionOfWrongType) {
  EXPECT_EQ(ParseError(Job({.training = "[10, 8]"})),
            "job.yaml:7:11: training: must be a map; got a list");
  EXPECT_EQ(ParseError(Job({.data = ""})),
            "job.yaml:6:1: data: must be a map; got null");
  EXPECT_EQ(ParseError("model:\ndata: {source: tensors}\n"),
            "job.yaml:1:1: model: must be a map; got null");
}

TEST(JobSpecErrorTest, ModelErrorsKeepTheirPosition) {
  EXPECT_EQ(ParseError("model:\n  input_shape: [4]\n  init: {seed: 0}\n"
                       "  loss: mse\n  layers: [{dense: {features: 0}}]\n"
                       "data: {source: synthetic-regression}\n"),
            "job.yaml:5:31: model.layers[0].dense.features: must be a "
            "positive integer; got '0'");
}

TEST(JobSpecErrorTest, Name) {
  EXPECT_EQ(ParseError(Job({.extra = "name: [a]\n"})),
            "job.yaml:9:7: name: must be a non-empty string; got a list");
  EXPECT_EQ(ParseError(Job({.extra = "name: ''\n"})),
            "job.yaml:9:7: name: must be a non-empty string; got the quoted "
            "string \"\"");
}

TEST(JobSpecErrorTest, DataSource) {
  EXPECT_EQ(ParseError(Job({.data = "{source: csv}"})),
            "job.yaml:6:16: data.source: unknown data source 'csv'; allowed: "
            "synthetic-regression, tensors, tokens, llmc, megatron");
  EXPECT_EQ(ParseError(Job({.data = "{seed: 1}"})),
            "job.yaml:6:7: data: missing required key 'source'");
  EXPECT_EQ(ParseError(Job({.data = "{source: tensors, sead: 1}"})),
            "job.yaml:6:25: data: unknown key 'sead'; allowed: source, seed, "
            "shuffle, path, blend, seq_len, dtype, uint16, vocab_size, "
            "documents, noise, num_samples");
}

TEST(JobSpecErrorTest, DataKeysOfAnotherSource) {
  EXPECT_EQ(
      ParseError(Job({.data = "{source: synthetic-regression, path: x.bin}"})),
      "job.yaml:6:38: data: 'path' does not apply to source "
      "synthetic-regression; it takes: source, seed, shuffle, noise, "
      "num_samples");
  EXPECT_EQ(ParseError(Job({.data = "{source: tensors, path: x, seq_len: 4}"})),
            "job.yaml:6:34: data: 'seq_len' does not apply to source tensors; "
            "it takes: source, seed, shuffle, path");
  EXPECT_EQ(ParseError(Job({.data = "{source: tokens, path: x, seq_len: 4, "
                                    "noise: 0.1}"})),
            "job.yaml:6:45: data: 'noise' does not apply to source tokens; "
            "it takes: source, seed, shuffle, path, seq_len, dtype, uint16, "
            "vocab_size, documents");
}

TEST(JobSpecErrorTest, DataRequiredPerSource) {
  EXPECT_EQ(ParseError(Job({.data = "{source: tensors}"})),
            "job.yaml:6:7: data: missing required key 'path'");
  EXPECT_EQ(ParseError(Job({.data = "{source: tokens, path: t.bin}"})),
            "job.yaml:6:7: data: missing required key 'seq_len'");
}

TEST(JobSpecErrorTest, DataThatDoesNotFitTheModelIsReportedAtTheDataSection) {
  // The model takes 4 floats; tokens need an embedding first.
  EXPECT_EQ(
      ParseError(Job({.data = "{source: tokens, path: t.bin, seq_len: 4}"})),
      "job.yaml:6:7: data: data.source tokens needs a model with token-id "
      "input [seq_len] (an embedding first), but the model's input is "
      "floats [4]");
}

TEST(JobSpecErrorTest, DataValues) {
  EXPECT_EQ(ParseError(Job({.data = "{source: tokens, path: t, seq_len: 0}"})),
            "job.yaml:6:42: data.seq_len: must be a positive integer; got '0'");
  EXPECT_EQ(
      ParseError(Job(
          {.data = "{source: tokens, path: t, seq_len: 4, vocab_size: 300}"})),
      "job.yaml:6:57: data.vocab_size: must be at most 256 for dtype uint8 "
      "tokens; got 300 (set dtype: uint16 or wider for vocabularies above "
      "256)");
  EXPECT_EQ(ParseError(Job({.data = "{source: tokens, path: t, seq_len: 4, "
                                    "uint16: true, vocab_size: 65537}"})),
            "job.yaml:6:71: data.vocab_size: must be at most 65536 for dtype "
            "uint16 tokens; got 65537");
  EXPECT_EQ(ParseError(Job({.data = "{source: tensors, path: ''}"})),
            "job.yaml:6:31: data.path: must be a non-empty string; got the "
            "quoted string \"\"");
  EXPECT_EQ(
      ParseError(Job({.data = "{source: synthetic-regression, noise: -1}"})),
      "job.yaml:6:45: data.noise: must be a non-negative number; got '-1'");
  EXPECT_EQ(ParseError(Job({.data = "{source: tensors, path: p, seed: -1}"})),
            "job.yaml:6:40: data.seed: must be a non-negative integer; got "
            "'-1'");
  EXPECT_EQ(ParseError(Job({.data = "{source: tensors, path: p, shuffle: "
                                    "yes}"})),
            "job.yaml:6:43: data.shuffle: must be true or false; got 'yes'");
}

// A data.vocab_size above the model's vocabulary once passed validate and
// failed the job hours later, at the first id the embedding had no row for.
TEST(JobSpecErrorTest, DataVocabularyLargerThanTheModels) {
  const std::string yaml = R"(model:
  input_shape: [4]
  init: {seed: 0}
  layers:
    - embedding: {vocab_size: 100, features: 8}
    - lm_head: {vocab_size: 120}
  loss: cross_entropy
data: {source: tokens, path: t, seq_len: 4, uint16: true, vocab_size: 101}
training: {steps: 1, batch_size: 2}
optimizer: {kind: sgd, lr: 0.1}
)";
  EXPECT_THAT(ParseError(yaml),
              HasSubstr("data.vocab_size is 101 but the model's vocabulary "
                        "is 100"));
  EXPECT_TRUE(ParseJobSpec(absl::StrReplaceAll(
                               yaml, {{"vocab_size: 101", "vocab_size: 100"}}),
                           "job.yaml")
                  .ok());
}

TEST(JobSpecErrorTest, TrainingValues) {
  EXPECT_EQ(ParseError(Job({.training = "{steps: 0, batch_size: 8}"})),
            "job.yaml:7:19: training.steps: must be a positive integer; got "
            "'0'");
  EXPECT_EQ(ParseError(Job({.training = "{steps: 1, batch_size: 0}"})),
            "job.yaml:7:34: training.batch_size: must be a positive integer; "
            "got '0'");
  EXPECT_EQ(ParseError(Job(
                {.training = "{steps: 1, batch_size: 8, microbatches: 0}"})),
            "job.yaml:7:51: training.microbatches: must be a positive "
            "integer; got '0'");
  EXPECT_EQ(ParseError(Job({.training = "{batch_size: 8}"})),
            "job.yaml:7:11: training: missing required key 'steps'");
  EXPECT_EQ(ParseError(Job({.training = "{steps: 1.5, batch_size: 8}"})),
            "job.yaml:7:19: training.steps: must be a positive integer; got "
            "'1.5'");
  EXPECT_EQ(ParseError(Job({.training = "{steps: 1, batch_size: 8, epochs: "
                                        "2}"})),
            "job.yaml:7:37: training: unknown key 'epochs'; allowed: steps, "
            "batch_size, microbatches, precision");
  EXPECT_EQ(ParseError(Job({.training = "{steps: 1, batch_size: 8, "
                                        "precision: fp16}"})),
            "job.yaml:7:48: training.precision: must be one of: fp32, bf16; "
            "got 'fp16'");
}

TEST(JobSpecTest, Bf16Precision) {
  const JobSpec job =
      ParseOk(Job({.training = "{steps: 3, batch_size: 4, precision: bf16}"}));
  EXPECT_EQ(job.training.precision, Precision::kBf16);
}

TEST(JobSpecErrorTest, BatchSizeNotAMultipleOfMicrobatches) {
  EXPECT_EQ(ParseError(Job(
                {.training = "{steps: 1, batch_size: 10, microbatches: 4}"})),
            "job.yaml:7:34: training.batch_size: batch_size = 10 is not a "
            "multiple of microbatches = 4: every microbatch must hold the "
            "same number of samples");
}

TEST(JobSpecErrorTest, OptimizerKind) {
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: lamb}"})),
            "job.yaml:8:19: optimizer.kind: must be one of: sgd, adam, adamw; "
            "got 'lamb'");
  EXPECT_EQ(ParseError(Job({.optimizer = "{lr: 0.1}"})),
            "job.yaml:8:12: optimizer: missing required key 'kind'");
}

TEST(JobSpecErrorTest, OptimizerKeysOfAnotherKind) {
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, momentum: 0.9}"})),
            "job.yaml:8:25: optimizer: 'momentum' does not apply to kind "
            "adam; it takes: kind, lr, betas, eps, weight_decay, "
            "clip_grad_norm, schedule");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: sgd, eps: 1e-8}"})),
            "job.yaml:8:24: optimizer: 'eps' does not apply to kind sgd; it "
            "takes: kind, lr, momentum, nesterov, dampening, weight_decay, "
            "clip_grad_norm, schedule");
  EXPECT_THAT(ParseError(Job({.optimizer = "{kind: adam, learning_rate: 1}"})),
              HasSubstr("job.yaml:8:25: optimizer: unknown key "
                        "'learning_rate'; allowed: kind, lr,"));
}

TEST(JobSpecErrorTest, OptimizerValues) {
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, lr: -1e-3}"})),
            "job.yaml:8:29: optimizer.lr: must be a non-negative number; got "
            "'-1e-3'");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, lr: \"0.1\"}"})),
            "job.yaml:8:29: optimizer.lr: must be a non-negative number; got "
            "the quoted string \"0.1\"");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, eps: -1.0e-8}"})),
            "job.yaml:8:30: optimizer.eps: must be a non-negative number; got "
            "'-1.0e-8'");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adamw, weight_decay: -0.1}"})),
            "job.yaml:8:40: optimizer.weight_decay: must be a non-negative "
            "number; got '-0.1'");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, clip_grad_norm: 0}"})),
            "job.yaml:8:41: optimizer.clip_grad_norm: must be a positive "
            "number; got '0'");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: sgd, momentum: -0.5}"})),
            "job.yaml:8:34: optimizer.momentum: must be a non-negative "
            "number; got '-0.5'");
}

TEST(JobSpecErrorTest, Nesterov) {
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: sgd, nesterov: true}"})),
            "job.yaml:8:34: optimizer.nesterov: nesterov needs momentum > 0 "
            "and dampening = 0; got momentum = 0, dampening = 0");
  EXPECT_THAT(ParseError(Job({.optimizer = "{kind: sgd, momentum: 0.9, "
                                           "dampening: 0.1, nesterov: true}"})),
              HasSubstr("job.yaml:8:65: optimizer.nesterov: nesterov needs "
                        "momentum > 0 and dampening = 0; got momentum = 0.9, "
                        "dampening = 0.1"));
}

TEST(JobSpecErrorTest, Betas) {
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, betas: [0.9, 1.0]}"})),
            "job.yaml:8:38: optimizer.betas[1]: must be in [0, 1); got 1.0");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, betas: [-0.1, 0.9]}"})),
            "job.yaml:8:33: optimizer.betas[0]: must be in [0, 1); got -0.1");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, betas: [0.9]}"})),
            "job.yaml:8:32: optimizer.betas: must be a list of two numbers "
            "[beta1, beta2], each in [0, 1); got a list of 1");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, betas: 0.9}"})),
            "job.yaml:8:32: optimizer.betas: must be a list of two numbers "
            "[beta1, beta2], each in [0, 1); got '0.9'");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, betas: [0.9, x]}"})),
            "job.yaml:8:38: optimizer.betas[1]: must be a number; got 'x'");
}

TEST(JobSpecErrorTest, ScheduleKindAndKeys) {
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, schedule: {kind: "
                                         "step}}"})),
            "job.yaml:8:42: optimizer.schedule.kind: must be one of: "
            "constant, linear-warmup, cosine; got 'step'");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, schedule: {kind: "
                                         "constant, warmup_steps: 3}}"})),
            "job.yaml:8:52: optimizer.schedule: 'warmup_steps' does not apply "
            "to schedule kind constant; it takes: kind");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, schedule: {kind: "
                                         "linear-warmup}}"})),
            "job.yaml:8:35: optimizer.schedule: missing required key "
            "'warmup_steps'");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, schedule: {kind: "
                                         "linear-warmup, total_steps: 3}}"})),
            "job.yaml:8:57: optimizer.schedule: 'total_steps' does not apply "
            "to schedule kind linear-warmup; it takes: kind, warmup_steps");
}

TEST(JobSpecErrorTest, CosineNeedsTotalAboveWarmup) {
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, schedule: {kind: "
                                         "cosine, warmup_steps: 5, "
                                         "total_steps: 5}}"})),
            "job.yaml:8:80: optimizer.schedule.total_steps: cosine needs "
            "total_steps > warmup_steps; got total_steps = 5, warmup_steps = "
            "5");
  // total_steps defaults to training.steps (10); the error is at
  // warmup_steps, the value that was written.
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, schedule: {kind: "
                                         "cosine, warmup_steps: 12}}"})),
            "job.yaml:8:64: optimizer.schedule.warmup_steps: cosine needs "
            "total_steps > warmup_steps; got total_steps = 10 "
            "(training.steps), warmup_steps = 12");
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, lr: 0.1, schedule: "
                                         "{kind: cosine, min_lr: 0.2}}"})),
            "job.yaml:8:67: optimizer.schedule.min_lr: must be at most lr = "
            "0.1 (cosine decays from lr to min_lr); got 0.2");
}

TEST(JobSpecErrorTest, Pipeline) {
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {virtual_stages: 0}\n"})),
            "job.yaml:9:28: pipeline.virtual_stages: must be a positive "
            "integer; got '0'");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {schedule: gpipe, stage: "
                                     "2}\n"})),
            "job.yaml:9:29: pipeline: unknown key 'stage'; allowed: "
            "schedule, virtual_stages, stages, num_stages, memory_budget, "
            "devices_per_stage, tensor_parallel, workers");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {schedule: gpipe, stages: "
                                     "2}\n"})),
            "job.yaml:9:37: pipeline.stages: must be one of: markers, auto; "
            "got '2'");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {schedule: {a: 1}}\n"})),
            "job.yaml:9:22: pipeline.schedule: must be a non-empty string; "
            "got a map");
}

TEST(JobSpecTest, DevicesPerStage) {
  EXPECT_EQ(ParseOk(Job({})).pipeline.devices_per_stage, 1);
  // Microbatches of 8 / 2 = 4 samples: 2 and 4 devices split them evenly.
  const JobSpec job =
      ParseOk(Job({.extra = "pipeline: {devices_per_stage: 4}\n"}));
  EXPECT_EQ(job.pipeline.devices_per_stage, 4);
  EXPECT_EQ(job.pipeline.devices_per_stage_where.ToString(), "job.yaml:9:31");
}

TEST(JobSpecErrorTest, DevicesPerStage) {
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {devices_per_stage: 3}\n"})),
            "job.yaml:9:31: pipeline.devices_per_stage: each replica of a "
            "stage (devices_per_stage / tensor_parallel = 3) takes an equal "
            "share of a microbatch, so it must divide the microbatch size "
            "(batch_size / microbatches = 4)");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {devices_per_stage: 0}\n"})),
            "job.yaml:9:31: pipeline.devices_per_stage: must be a positive "
            "integer; got '0'");
  EXPECT_THAT(ParseError(Job({.extra = "pipeline: {devices_per_stage: 65}\n"})),
              HasSubstr("pipeline.devices_per_stage"));
}

// A Llama job (4 query heads sharing 2 key/value heads, 8 hidden units)
// with `pipeline` as given.
std::string LlamaJob(const std::string& pipeline) {
  return absl::StrCat(
      "model:\n"
      "  input_shape: [4]\n"
      "  init: {seed: 0}\n"
      "  loss: cross_entropy\n"
      "  layers:\n"
      "    - embedding: {vocab_size: 16, features: 8}\n"
      "    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 8}\n"
      "    - lm_head: {vocab_size: 16}\n"
      "data: {source: tokens, path: t.bin, seq_len: 4, vocab_size: 16}\n"
      "training: {steps: 1, batch_size: 8, microbatches: 2}\n"
      "optimizer: {kind: sgd, lr: 0.1}\n"
      "pipeline: ",
      pipeline, "\n");
}

TEST(JobSpecTest, TensorParallel) {
  EXPECT_EQ(ParseOk(Job({})).pipeline.tensor_parallel, 1);
  const JobSpec job =
      ParseOk(LlamaJob("{devices_per_stage: 4, tensor_parallel: 2}"));
  EXPECT_EQ(job.pipeline.tensor_parallel, 2);
  EXPECT_EQ(job.pipeline.tensor_parallel_where.ToString(), "job.yaml:12:51");
  // Two replicas of 2 ranks share microbatches of 4 rows.
  EXPECT_EQ(ParseOk(LlamaJob("{devices_per_stage: 8, tensor_parallel: 2}"))
                .pipeline.devices_per_stage,
            8);
}

TEST(JobSpecErrorTest, TensorParallel) {
  EXPECT_EQ(ParseError(LlamaJob("{devices_per_stage: 4, tensor_parallel: 3}")),
            "job.yaml:12:51: pipeline.tensor_parallel: a stage's mesh of "
            "devices_per_stage (4) devices splits into replicas of "
            "tensor_parallel devices each, so tensor_parallel must divide "
            "it; got 3");
  // kv_heads 2 does not split over 4 ranks: the error is at the layer.
  EXPECT_THAT(
      ParseError(LlamaJob("{devices_per_stage: 4, tensor_parallel: 4}")),
      ::testing::AllOf(HasSubstr("job.yaml:7:7:"), HasSubstr("llama_block"),
                       HasSubstr("kv_heads (2) does not split over 4")));
  EXPECT_THAT(ParseError(Job({.extra = "pipeline: {devices_per_stage: 2, "
                                       "tensor_parallel: 2}\n"})),
              HasSubstr("pipeline.tensor_parallel: no layer of this model "
                        "splits"));
  EXPECT_THAT(
      ParseError(LlamaJob("{devices_per_stage: 2, tensor_parallel: 0}")),
      HasSubstr("pipeline.tensor_parallel: must be a positive integer"));
}

TEST(JobSpecTest, AutoScheduleTakesWorkers) {
  const JobSpec job = ParseOk(
      Job({.extra = "pipeline: {schedule: auto, stages: auto, workers: 3}\n"}));
  EXPECT_TRUE(job.pipeline.auto_schedule);
  EXPECT_TRUE(job.pipeline.auto_stages);
  EXPECT_EQ(job.pipeline.workers, 3);
  EXPECT_EQ(job.pipeline.num_stages, 3);
  EXPECT_EQ(job.pipeline.schedule, "auto");
}

TEST(JobSpecErrorTest, AutoSchedule) {
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {schedule: auto}\n"})),
            "job.yaml:9:22: pipeline.schedule: schedule: auto chooses the cut "
            "with the schedule: set stages: auto and workers: P");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {schedule: auto, stages: "
                                     "auto}\n"})),
            "job.yaml:9:11: pipeline: schedule: auto needs workers (how many "
            "pipeline ranks to choose a schedule for)");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {schedule: auto, stages: "
                                     "auto, num_stages: 4}\n"})),
            "job.yaml:9:54: pipeline.num_stages: schedule: auto chooses "
            "num_stages (workers x virtual stages); give workers: P instead");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {schedule: auto, "
                                     "virtual_stages: 2}\n"})),
            "job.yaml:9:44: pipeline.virtual_stages: schedule: auto chooses "
            "virtual_stages; leave it out");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {schedule: 1f1b, workers: "
                                     "2}\n"})),
            "job.yaml:9:37: pipeline.workers: only applies with schedule: auto "
            "(otherwise the stages and virtual_stages give the workers)");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {schedule: auto, stages: "
                                     "auto, workers: 0}\n"})),
            "job.yaml:9:51: pipeline.workers: must be a positive integer; "
            "got '0'");
}

TEST(JobSpecErrorTest, AutoStages) {
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {stages: auto}\n"})),
            "job.yaml:9:11: pipeline: stages: auto needs num_stages (how many "
            "pipeline stages to cut the model into)");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {num_stages: 2}\n"})),
            "job.yaml:9:24: pipeline.num_stages: only applies with stages: "
            "auto (the model's boundary markers define the stages otherwise)");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {stages: markers, "
                                     "memory_budget: 1GiB}\n"})),
            "job.yaml:9:44: pipeline.memory_budget: only applies with stages: "
            "auto (the model's boundary markers define the stages otherwise)");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {stages: auto, num_stages: "
                                     "0}\n"})),
            "job.yaml:9:38: pipeline.num_stages: must be a positive integer; "
            "got '0'");
  EXPECT_EQ(ParseError(Job({.extra = "pipeline: {stages: auto, num_stages: "
                                     "2000}\n"})),
            "job.yaml:9:38: pipeline.num_stages: must be at most 1024; got "
            "2000");
  for (const char* bad :
       {"-5", "0", "12 parsecs", "GiB", "1e400", "nan", "0.5"}) {
    const std::string error = ParseError(
        Job({.extra = absl::StrCat("pipeline: {stages: auto, num_stages: 2, "
                                   "memory_budget: '",
                                   bad, "'}\n")}));
    EXPECT_THAT(error, HasSubstr("job.yaml:9:56: pipeline.memory_budget: must "
                                 "be a positive number of bytes"))
        << bad;
  }
}

TEST(JobSpecTest, AutoStagesAndMemoryBudget) {
  const struct {
    const char* text;
    double bytes;
  } kCases[] = {{"1000", 1000},
                {"'1.5e9'", 1.5e9},
                {"2KB", 2000},
                {"3 MB", 3e6},
                {"16GiB", 16.0 * (1 << 30)},
                {"'512 MiB'", 512.0 * (1 << 20)},
                {"1TiB", 1099511627776.0},
                {"7B", 7}};
  for (const auto& c : kCases) {
    absl::StatusOr<JobSpec> job = ParseJobSpec(
        Job({.extra = absl::StrCat("pipeline: {schedule: zb-h1, stages: auto, "
                                   "num_stages: 3, memory_budget: ",
                                   c.text, "}\n")}),
        "job.yaml");
    ASSERT_TRUE(job.ok()) << c.text << ": " << job.status();
    EXPECT_TRUE(job->pipeline.auto_stages);
    EXPECT_EQ(job->pipeline.num_stages, 3);
    EXPECT_DOUBLE_EQ(job->pipeline.memory_budget_bytes, c.bytes) << c.text;
    EXPECT_EQ(job->pipeline.num_stages_where.line, 9);
  }
  absl::StatusOr<JobSpec> markers =
      ParseJobSpec(Job({.extra = "pipeline: {stages: markers}\n"}), "job.yaml");
  ASSERT_TRUE(markers.ok()) << markers.status();
  EXPECT_FALSE(markers->pipeline.auto_stages);
  EXPECT_EQ(markers->pipeline.memory_budget_bytes, 0);
}

TEST(JobSpecErrorTest, Checkpoint) {
  EXPECT_EQ(ParseError(Job({.extra = "checkpoint: {dir: c, every: -1}\n"})),
            "job.yaml:9:29: checkpoint.every: must be a non-negative integer; "
            "got '-1'");
  EXPECT_EQ(ParseError(Job({.extra = "checkpoint: {dir: c, keep_latest: "
                                     "-3}\n"})),
            "job.yaml:9:35: checkpoint.keep_latest: must be a non-negative "
            "integer; got '-3'");
  EXPECT_EQ(ParseError(Job({.extra = "checkpoint: {every: 5}\n"})),
            "job.yaml:9:13: checkpoint: missing required key 'dir'");
}

TEST(JobSpecErrorTest, DuplicateKeyInSection) {
  EXPECT_EQ(ParseError(Job({.optimizer = "{kind: adam, lr: 0.1, lr: 0.2}"})),
            "job.yaml:8:34: optimizer: duplicate key 'lr'");
}

TEST(JobSpecTest, ResumeAndRestart) {
  const JobSpec none = ParseOk(Job({}));
  EXPECT_EQ(none.resume.kind, ResumeSpec::Kind::kNone);
  EXPECT_EQ(none.restart.max_restarts, 0);

  const JobSpec latest =
      ParseOk(Job({.extra = "checkpoint: {dir: out, every: 2}\nresume: latest\n"
                            "restart: {max_restarts: 3}\n"}),
              "job.yaml", "/base");
  EXPECT_EQ(latest.resume.kind, ResumeSpec::Kind::kLatest);
  EXPECT_EQ(latest.restart.max_restarts, 3);

  // A path resolves against the job's directory like every other path.
  const JobSpec path =
      ParseOk(Job({.extra = "resume: old/step-40\n"}), "job.yaml", "/base");
  EXPECT_EQ(path.resume.kind, ResumeSpec::Kind::kPath);
  EXPECT_EQ(path.resume.path, "/base/old/step-40");
  EXPECT_EQ(path.resume.where.line, 9);
}

TEST(JobSpecErrorTest, ResumeAndRestart) {
  // Never a silent fresh start: "latest" with nowhere to look is an error.
  EXPECT_EQ(ParseError(Job({.extra = "resume: latest\n"})),
            "job.yaml:9:9: resume: 'latest' needs checkpoint.dir, where the "
            "job's checkpoints are; or give the checkpoint's path");
  EXPECT_EQ(ParseError(Job({.extra = "resume: ''\n"})),
            "job.yaml:9:9: resume: must be a non-empty string; got the quoted "
            "string \"\"");
  EXPECT_EQ(ParseError(Job({.extra = "resume: [a]\n"})),
            "job.yaml:9:9: resume: must be a non-empty string; got a list");
  EXPECT_EQ(ParseError(Job({.extra = "restart: {max_restarts: -1}\n"})),
            "job.yaml:9:25: restart.max_restarts: must be a non-negative "
            "integer; got '-1'");
  EXPECT_EQ(ParseError(Job({.extra = "restart: {}\n"})),
            "job.yaml:9:10: restart: missing required key 'max_restarts'");
  EXPECT_EQ(ParseError(Job({.extra = "restart: {max_restart: 1}\n"})),
            "job.yaml:9:11: restart: unknown key 'max_restart'; allowed: "
            "max_restarts, elastic");
  // elastic: {min_workers: K}, K >= 1.
  absl::StatusOr<JobSpec> elastic = ParseJobSpec(
      Job({.extra = "restart: {max_restarts: 2, elastic: {min_workers: 3}}\n"}),
      "job.yaml");
  ASSERT_TRUE(elastic.ok()) << elastic.status();
  EXPECT_EQ(elastic->restart.max_restarts, 2);
  EXPECT_EQ(elastic->restart.elastic_min_workers, 3);
  EXPECT_EQ(ParseError(Job({.extra = "restart: {max_restarts: 1, elastic: "
                                     "{min_workers: 0}}\n"})),
            "job.yaml:9:51: restart.elastic.min_workers: must be a positive "
            "integer; got '0'");
  EXPECT_EQ(ParseError(Job({.extra = "restart: {max_restarts: 1, elastic: "
                                     "{}}\n"})),
            "job.yaml:9:37: restart.elastic: missing required key "
            "'min_workers'");
  EXPECT_EQ(ParseError(Job({.extra = "restart: {max_restarts: 1, elastic: "
                                     "{min: 2}}\n"})),
            "job.yaml:9:38: restart.elastic: unknown key 'min'; allowed: "
            "min_workers");
}

}  // namespace
}  // namespace conveyor::job
