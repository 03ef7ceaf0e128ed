#include "cli/overrides.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/job_file.h"
#include "common/yaml_load_count.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_spec.h"

namespace conveyor::cli {
namespace {

using ::testing::HasSubstr;

constexpr size_t kMax = 1 << 20;

constexpr char kJob[] = R"(# A comment that --set drops.
name: mlp
model:
  input_shape: [4]
  init: {seed: 0}
  layers:
    - dense: {features: 8}
    - relu
    - boundary
    - dense: {features: 4}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training:
  steps: 10
  batch_size: 8
  microbatches: 2
optimizer: {kind: adam, lr: 0.001}
)";

absl::StatusOr<YAML::Node> Apply(absl::string_view yaml,
                                 std::vector<std::string> specs) {
  absl::StatusOr<std::string> out =
      ApplyOverrides(yaml, "job.yaml", specs, kMax);
  if (!out.ok()) return out.status();
  return YAML::Load(*out);
}

TEST(ParseOverrideTest, SplitsAtTheFirstEquals) {
  absl::StatusOr<Override> o = ParseOverride("model.init.from=a=b.safetensors");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->path, (std::vector<std::string>{"model", "init", "from"}));
  EXPECT_EQ(o->value, "a=b.safetensors");
}

TEST(ParseOverrideTest, RejectsMissingEqualsEmptyKeysAndEmptyComponents) {
  for (const char* bad : {"steps", "=3", ".a=1", "a..b=1", "a.=1"}) {
    absl::StatusOr<Override> o = ParseOverride(bad);
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(o.status().message(), HasSubstr("--set needs key.path=value"))
        << bad;
    EXPECT_THAT(o.status().message(), HasSubstr(bad));
  }
}

TEST(ApplyOverridesTest, SetsNestedKeysWithYamlTypes) {
  absl::StatusOr<YAML::Node> doc =
      Apply(kJob, {"training.steps=500", "optimizer.betas=[0.9, 0.95]",
                   "data.shuffle=true", "optimizer.kind=sgd"});
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ((*doc)["training"]["steps"].as<int>(), 500);
  EXPECT_EQ((*doc)["training"]["batch_size"].as<int>(), 8);  // Untouched.
  ASSERT_TRUE((*doc)["optimizer"]["betas"].IsSequence());
  EXPECT_DOUBLE_EQ((*doc)["optimizer"]["betas"][1].as<double>(), 0.95);
  EXPECT_TRUE((*doc)["data"]["shuffle"].as<bool>());
  EXPECT_EQ((*doc)["optimizer"]["kind"].as<std::string>(), "sgd");
}

TEST(ApplyOverridesTest, CreatesMissingMaps) {
  absl::StatusOr<YAML::Node> doc =
      Apply(kJob, {"checkpoint.dir=out/x", "pipeline.schedule=gpipe"});
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ((*doc)["checkpoint"]["dir"].as<std::string>(), "out/x");
  EXPECT_EQ((*doc)["pipeline"]["schedule"].as<std::string>(), "gpipe");
}

TEST(ApplyOverridesTest, WalksListsByIndex) {
  absl::StatusOr<YAML::Node> doc =
      Apply(kJob, {"model.layers.3.dense.features=16", "model.layers.1=gelu"});
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ((*doc)["model"]["layers"][3]["dense"]["features"].as<int>(), 16);
  EXPECT_EQ((*doc)["model"]["layers"][1].as<std::string>(), "gelu");
  EXPECT_EQ((*doc)["model"]["layers"].size(), 4u);
}

TEST(ApplyOverridesTest, LaterOverridesWin) {
  absl::StatusOr<YAML::Node> doc =
      Apply(kJob, {"training.steps=5", "training.steps=7"});
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ((*doc)["training"]["steps"].as<int>(), 7);
}

TEST(ApplyOverridesTest, EmptyDocumentBecomesAMap) {
  absl::StatusOr<YAML::Node> doc = Apply("", {"a.b=1"});
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ((*doc)["a"]["b"].as<int>(), 1);
}

TEST(ApplyOverridesTest, WithoutOverridesReturnsTheTextUnchanged) {
  absl::StatusOr<std::string> out = ApplyOverrides(kJob, "job.yaml", {}, kMax);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, kJob);
}

TEST(ApplyOverridesTest, QuotedStringsStayStrings) {
  // The strict job reader takes a quoted "3" as a string: re-emitting it
  // plain would silently turn it into a number.
  absl::StatusOr<std::string> out =
      ApplyOverrides("name: \"007\"\ntraining: {steps: 3}\n", "job.yaml",
                     {"data.path='123'"}, kMax);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("name: \"007\""));
  EXPECT_THAT(*out, HasSubstr("path: \"123\""));
  EXPECT_THAT(*out, HasSubstr("steps: 3"));
}

TEST(ApplyOverridesTest, RejectsPathsThroughScalars) {
  absl::StatusOr<YAML::Node> doc = Apply(kJob, {"training.steps.x=1"});
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(doc.status().message(),
              HasSubstr("--set training.steps.x=1: training.steps is"));
  EXPECT_THAT(doc.status().message(), HasSubstr("not a map"));
}

TEST(ApplyOverridesTest, RejectsBadListIndices) {
  for (const char* spec : {"model.layers.9=relu", "model.layers.x=relu"}) {
    absl::StatusOr<YAML::Node> doc = Apply(kJob, {spec});
    ASSERT_FALSE(doc.ok()) << spec;
    EXPECT_THAT(doc.status().message(),
                HasSubstr("model.layers is a list of 4 item(s)"));
  }
}

TEST(ApplyOverridesTest, RejectsValuesThatAreNotYaml) {
  absl::StatusOr<YAML::Node> doc = Apply(kJob, {"optimizer.betas=[0.9,"});
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(doc.status().message(), HasSubstr("--set optimizer.betas=[0.9,"));
}

TEST(ApplyOverridesTest, ReportsYamlErrorsInTheFileAtTheirPosition) {
  absl::StatusOr<YAML::Node> doc = Apply("a: [1,\nb: 2\n", {"a=1"});
  ASSERT_FALSE(doc.ok());
  EXPECT_THAT(doc.status().message(), HasSubstr("job.yaml:"));
}

TEST(ApplyOverridesTest, RejectsATopLevelThatIsNotAMap) {
  absl::StatusOr<YAML::Node> doc = Apply("- 1\n- 2\n", {"a=1"});
  ASSERT_FALSE(doc.ok());
  EXPECT_THAT(doc.status().message(), HasSubstr("needs a job that is a map"));
}

TEST(ApplyOverridesTest, StopsAnAliasBombAtTheSizeLimit) {
  std::string yaml = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'h'; ++c) {
    const char prev = static_cast<char>(c - 1);
    yaml +=
        absl::StrCat(std::string(1, c), ": &", std::string(1, c), " [*",
                     std::string(1, prev), ", *", std::string(1, prev), ", *",
                     std::string(1, prev), ", *", std::string(1, prev), ", *",
                     std::string(1, prev), ", *", std::string(1, prev), ", *",
                     std::string(1, prev), ", *", std::string(1, prev), "]\n");
  }
  absl::StatusOr<std::string> out =
      ApplyOverrides(yaml, "bomb.yaml", {"z=1"}, 1 << 16);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("exceeds 65536 bytes"));
  // Where the file crosses the limit, as the job reader would say it: the
  // size is crossed in an expansion of a (line 1).
  EXPECT_THAT(out.status().message(), HasSubstr("bomb.yaml:1:"));
}

// The depth limit names the place in the file (it once lost file:line:col
// with --set); a depth that only the flags create names the flags.
TEST(ApplyOverridesTest, TheDepthLimitNamesItsPlace) {
  std::string deep = "a: ";
  for (int i = 0; i < 70; ++i) deep += "[";
  for (int i = 0; i < 70; ++i) deep += "]";
  absl::StatusOr<std::string> out =
      ApplyOverrides(deep + "\n", "deep.yaml", {"z=1"}, 1 << 20);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(),
              HasSubstr("deep.yaml:1:68: the job document nests deeper than "
                        "64 levels"));

  std::string path = "c";
  for (int i = 0; i < 70; ++i) path += ".k";
  out = ApplyOverrides("a: 1\n", "job.yaml", {"b=2", path + "=1"}, 1 << 20);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(),
              HasSubstr(absl::StrCat("job.yaml with --set b=2 --set ", path,
                                     "=1: the job document nests deeper")));
}

TEST(ApplyOverridesTest, TheResultParsesAsTheSameJob) {
  absl::StatusOr<std::string> out =
      ApplyOverrides(kJob, "job.yaml", {"training.steps=3"}, kMax);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<job::JobSpec> job =
      job::ParseJobSpec(*out, "job.yaml (with --set)");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->training.steps, 3);
  EXPECT_EQ(job->name, "mlp");
  EXPECT_EQ(job->model.num_stages, 2);
}

class JobFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "job.yaml").string();
    std::ofstream(path_) << kJob;
  }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(JobFileTest, ReadsTheFileWithAnAbsoluteBaseDir) {
  absl::StatusOr<JobSource> source = ReadJobSource(path_, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->yaml, kJob);
  EXPECT_EQ(source->file_name, path_);
  EXPECT_EQ(source->base_dir,
            std::filesystem::absolute(dir_).lexically_normal().string());
}

TEST_F(JobFileTest, NamesTheFileAsOverridden) {
  absl::StatusOr<JobSource> source = ReadJobSource(path_, {"training.steps=x"});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->file_name, path_ + " (with --set)");
  // The error position refers to the emitted text, which says so.
  absl::StatusOr<job::ParsedJob> job = ParseJobSource(*source);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(), HasSubstr(path_ + " (with --set):"));
  EXPECT_THAT(job.status().message(), HasSubstr("training.steps"));
}

TEST_F(JobFileTest, ErrorsOfTheFileKeepTheirPosition) {
  // Line 14 of the file; an unrelated override must not move it.
  std::string text = kJob;
  text.replace(text.find("steps: 10"), 9, "steps: -1");
  std::ofstream(path_) << text;
  absl::StatusOr<JobSource> source =
      ReadJobSource(path_, {"optimizer.lr=0.01"});
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<job::ParsedJob> job = ParseJobSource(*source);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(std::string(job.status().message()),
              ::testing::StartsWith(path_ + ":14:10: training.steps: "));
}

TEST_F(JobFileTest, MissingFileIsNotFound) {
  absl::StatusOr<JobSource> source =
      ReadJobSource((dir_ / "missing.yaml").string(), {});
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobFileTest, TooLargeFileIsInvalid) {
  const std::string big = (dir_ / "big.yaml").string();
  std::ofstream(big) << std::string(job::kMaxJobFileBytes + 1, '#');
  absl::StatusOr<JobSource> source = ReadJobSource(big, {});
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
}

// --steps below a cosine schedule's warmup would make the job invalid: the
// warmup scales with it, and says so. Anything else is left as written.
TEST_F(JobFileTest, StepsBelowACosineWarmupScaleIt) {
  std::string cosine = kJob;
  cosine.replace(cosine.find("steps: 10"), 9, "steps: 100");
  cosine.replace(cosine.find("optimizer: {kind: adam, lr: 0.001}"), 34,
                 "optimizer: {kind: adam, lr: 0.01, schedule: {kind: cosine, "
                 "warmup_steps: 40}}");
  std::ofstream(path_) << cosine;
  // What the job says after `--steps S` (with `overrides`), and the note.
  auto run = [&](std::vector<std::string> overrides, int64_t steps,
                 std::string* note) -> job::JobSpec {
    absl::StatusOr<JobSource> source =
        ReadJobSource(path_, overrides, steps, note);
    EXPECT_TRUE(source.ok()) << source.status();
    if (!source.ok()) return {};
    absl::StatusOr<job::ParsedJob> job = ParseJobSource(*source);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->spec : job::JobSpec();
  };
  std::string note;
  job::JobSpec job = run({}, 5, &note);
  EXPECT_EQ(job.training.steps, 5);
  EXPECT_EQ(job.optimizer.schedule.warmup_steps, 2);
  EXPECT_THAT(note, HasSubstr("warmup_steps scaled from 40 (of 100 steps) "
                              "to 2"));
  // At most S - 1, scaled by S / training.steps otherwise.
  EXPECT_EQ(
      run({"training.steps=50"}, 40, &note).optimizer.schedule.warmup_steps,
      32);
  EXPECT_EQ(run({}, 3, &note).optimizer.schedule.warmup_steps, 1);
  // Enough steps for the warmup: untouched, no note.
  note.clear();
  job = run({}, 41, &note);
  EXPECT_EQ(job.training.steps, 41);
  EXPECT_EQ(job.optimizer.schedule.warmup_steps, 40);
  EXPECT_EQ(note, "");
}

// One YAML load of each text: the file (to apply --set and --steps) and
// what is sent (the job's one parse), however many overrides there are.
TEST_F(JobFileTest, StepsAndOverridesLoadEachTextOnce) {
  std::ofstream(path_) << kJob;
  TEST_CountYamlLoads(true);
  std::string note;
  absl::StatusOr<JobSource> source = ReadJobSource(
      path_, {"optimizer.lr=0.01", "training.steps=50"}, 7, &note);
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<job::ParsedJob> job = ParseJobSource(*source);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.training.steps, 7);
  EXPECT_EQ(TEST_YamlLoadsOf(kJob), 1);
  EXPECT_EQ(TEST_YamlLoadsOf(source->yaml), 1);
  TEST_CountYamlLoads(false);
}

}  // namespace
}  // namespace conveyor::cli
