#include "job/config_diff.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/config_hash.h"

namespace conveyor::job {
namespace {

using Kind = ConfigDifference::Kind;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kBase[] = R"(name: gpt
model:
  input_shape: [4]
  layers:
    - dense: {features: 8}
    - relu
    - boundary
    - dense: {features: 64}
    - dense: {features: 4}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 100, batch_size: 8, microbatches: 2}
optimizer:
  kind: adam
  lr: 0.001
  betas: [0.9, 0.999]
pipeline: {schedule: 1f1b}
checkpoint: {dir: /ckpt, every: 10}
)";

std::string Edit(std::vector<std::pair<std::string, std::string>> edits) {
  return absl::StrReplaceAll(kBase, edits);
}

ConfigDiff Diff(const std::string& old_yaml, const std::string& new_yaml,
                ConfigScope scope = ConfigScope::kTraining) {
  absl::StatusOr<ConfigDiff> diff = DiffJobConfigs(old_yaml, new_yaml, scope);
  EXPECT_TRUE(diff.ok()) << diff.status();
  return diff.ok() ? *std::move(diff) : ConfigDiff();
}

std::vector<std::string> Paths(const ConfigDiff& diff) {
  std::vector<std::string> paths;
  for (const ConfigDifference& d : diff.differences) paths.push_back(d.path);
  return paths;
}

TEST(ConfigDiffTest, NamesNestedKeysWithBothValues) {
  const ConfigDiff diff =
      Diff(kBase, Edit({{"lr: 0.001", "lr: 0.0003"},
                        {"{features: 64}", "{features: 128}"}}));
  EXPECT_EQ(diff.total, 2);
  EXPECT_TRUE(diff.complete);
  // This job's key order: model comes before optimizer in the file.
  ASSERT_THAT(Paths(diff),
              ElementsAre("model.layers[3].dense.features", "optimizer.lr"));
  EXPECT_EQ(diff.differences[0].kind, Kind::kChanged);
  EXPECT_EQ(diff.differences[0].old_value, "64");
  EXPECT_EQ(diff.differences[0].new_value, "128");
  EXPECT_EQ(DescribeConfigDiff(diff),
            "model.layers[3].dense.features differs (64 in the checkpoint, "
            "128 in this job); optimizer.lr differs (0.001, 0.0003)");
}

TEST(ConfigDiffTest, AddedAndRemovedKeys) {
  const ConfigDiff diff =
      Diff(kBase, Edit({{"seed: 0}", "seed: 0, shuffle: true}"},
                        {"  betas: [0.9, 0.999]\n", ""}}));
  ASSERT_THAT(Paths(diff), ElementsAre("data.shuffle", "optimizer.betas"));
  EXPECT_EQ(diff.differences[0].kind, Kind::kOnlyInNew);
  EXPECT_EQ(diff.differences[1].kind, Kind::kOnlyInOld);
  EXPECT_EQ(DescribeConfigDiff(diff),
            "data.shuffle is set in this job only (true); optimizer.betas is "
            "set in the checkpoint only ([0.9, 0.999])");
  // A whole section.
  const ConfigDiff section =
      Diff(kBase, absl::StrCat(kBase, "precision: {dtype: bf16}\n"));
  ASSERT_THAT(Paths(section), ElementsAre("precision"));
  EXPECT_EQ(section.differences[0].new_value, "{dtype: bf16}");
}

TEST(ConfigDiffTest, ListsOfDifferentLengthAndTypes) {
  const ConfigDiff longer = Diff(
      kBase, Edit({{"    - dense: {features: 4}\n",
                    "    - dense: {features: 4}\n    - relu\n    - relu\n"}}));
  ASSERT_THAT(Paths(longer), ElementsAre("model.layers[5]", "model.layers[6]"));
  EXPECT_EQ(longer.differences[0].kind, Kind::kOnlyInNew);
  EXPECT_THAT(DescribeConfigDiff(longer),
              HasSubstr("model.layers[5] is in this job only (relu)"));
  const ConfigDiff shorter =
      Diff(kBase, Edit({{"betas: [0.9, 0.999]", "betas: [0.9]"}}));
  ASSERT_THAT(Paths(shorter), ElementsAre("optimizer.betas[1]"));
  EXPECT_EQ(shorter.differences[0].kind, Kind::kOnlyInOld);
  EXPECT_EQ(shorter.differences[0].old_value, "0.999");

  // A scalar that became a map, and a long value summarized.
  const ConfigDiff retyped =
      Diff(kBase, Edit({{"    - relu\n",
                         "    - {gelu: {approximate: tanh, extra_long_key_"
                         "name: extra_long_value}}\n"}}));
  ASSERT_THAT(Paths(retyped), ElementsAre("model.layers[1]"));
  EXPECT_EQ(retyped.differences[0].old_value, "relu");
  EXPECT_EQ(retyped.differences[0].new_value, "a map of 1 key");
}

TEST(ConfigDiffTest, ScopesFollowTheHashes) {
  // The bookkeeping sections never count; the pipeline and the boundaries
  // count only for the config hash.
  const std::string moved =
      Edit({{"name: gpt", "name: other"},
            {"/ckpt, every: 10", "/elsewhere, every: 5"},
            {"{schedule: 1f1b}", "{schedule: gpipe}"},
            {"    - relu\n    - boundary\n", "    - boundary\n    - relu\n"}});
  const ConfigDiff training = Diff(kBase, moved, ConfigScope::kTraining);
  EXPECT_TRUE(training.empty()) << DescribeConfigDiff(training);
  const ConfigDiff config = Diff(kBase, moved, ConfigScope::kConfig);
  EXPECT_THAT(Paths(config), ElementsAre("model.layers[1]", "model.layers[2]",
                                         "pipeline.schedule"));
  // With the boundaries left out, the indices are still this job's.
  const ConfigDiff indexed = Diff(
      kBase,
      Edit({{"    - relu\n    - boundary\n", "    - boundary\n    - relu\n"},
            {"{features: 64}", "{features: 65}"}}));
  EXPECT_THAT(Paths(indexed), ElementsAre("model.layers[3].dense.features"));

  // An empty diff exactly when the matching hash is equal.
  const std::vector<std::string> others = {
      kBase,
      moved,
      Edit({{"lr: 0.001", "lr: 0.0010"}}),
      Edit({{"training: {steps: 100, batch_size: 8, microbatches: 2}",
             "training:\n  microbatches: 2\n  batch_size: 8\n  steps: 100"}}),
      Edit({{"seed: 0}", "seed: 0, extra: }"}}),
      Edit({{"  loss: mse\n", "  loss: mse\n  boundary_every: 2\n"}}),
      absl::StrCat(kBase, "eval: {every: 5, batches: 1}\n"),
  };
  for (const std::string& other : others) {
    EXPECT_EQ(Diff(kBase, other, ConfigScope::kConfig).empty(),
              JobConfigHash(kBase) == JobConfigHash(other))
        << other;
    EXPECT_EQ(Diff(kBase, other, ConfigScope::kTraining).empty(),
              JobTrainingHash(kBase) == JobTrainingHash(other))
        << other;
  }
}

TEST(ConfigDiffTest, CapsTheListAndCountsTheRest) {
  std::string many_old = "data:\n";
  std::string many_new = "data:\n";
  for (int i = 0; i < kMaxListedDifferences + 20; ++i) {
    absl::StrAppend(&many_old, "  k", i, ": 1\n");
    absl::StrAppend(&many_new, "  k", i, ": 2\n");
  }
  const ConfigDiff diff = Diff(many_old, many_new);
  EXPECT_EQ(diff.total, kMaxListedDifferences + 20);
  EXPECT_EQ(diff.differences.size(), size_t{kMaxListedDifferences});
  const std::string text = DescribeConfigDiff(diff, 3);
  EXPECT_EQ(text,
            absl::StrCat("data.k0 differs (1 in the checkpoint, 2 in this "
                         "job); data.k1 differs (1, 2); data.k2 differs (1, "
                         "2); and ",
                         kMaxListedDifferences + 17, " more"));
  EXPECT_THAT(DescribeConfigDiff(ConfigDiff()), IsEmpty());
}

TEST(ConfigDiffTest, StopsOnTreesBeyondTheBounds) {
  // Each level doubles the tree through aliases: 2^30 leaves from a few
  // hundred bytes.
  std::string bomb = "a0: &a0 [x, x]\n";
  for (int i = 1; i <= 30; ++i) {
    absl::StrAppend(&bomb, "a", i, ": &a", i, " [*a", i - 1, ", *a", i - 1,
                    "]\n");
  }
  const std::string other = absl::StrReplaceAll(bomb, {{"[x, x]", "[x, y]"}});
  const ConfigDiff diff = Diff(bomb, other);
  EXPECT_FALSE(diff.complete);
  EXPECT_FALSE(diff.empty());
  EXPECT_THAT(DescribeConfigDiff(diff), HasSubstr("too large to compare"));
}

TEST(ConfigDiffTest, RefusesTextThatIsNotYaml) {
  absl::StatusOr<ConfigDiff> diff =
      DiffJobConfigs(kBase, "model: [unclosed", ConfigScope::kTraining);
  EXPECT_EQ(diff.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(diff.status().message(), HasSubstr("this job"));
}

TEST(StepsChangeTest, OnlyTrainingStepsAndTheScheduleLength) {
  const std::string cosine =
      Edit({{"  betas: [0.9, 0.999]\n",
             "  schedule: {kind: cosine, warmup_steps: 10}\n"}});
  const std::string longer =
      absl::StrReplaceAll(cosine, {{"steps: 100,", "steps: 200,"}});
  ConfigDiff diff = Diff(cosine, longer);
  std::optional<StepsChange> change = FindStepsChange(diff, cosine, longer);
  ASSERT_TRUE(change.has_value()) << DescribeConfigDiff(diff);
  EXPECT_EQ(change->old_steps, 100);
  EXPECT_EQ(change->new_steps, 200);
  EXPECT_EQ(change->schedule_kind, "cosine");
  EXPECT_EQ(change->warmup_steps, 10);
  EXPECT_EQ(change->old_span, 100);
  EXPECT_EQ(change->new_span, 200);

  // An explicit total_steps raised with it, or kept.
  const std::string explicit_old = absl::StrReplaceAll(
      cosine, {{"warmup_steps: 10}", "warmup_steps: 10, total_steps: 100}"}});
  const std::string explicit_new = absl::StrReplaceAll(
      longer, {{"warmup_steps: 10}", "warmup_steps: 10, total_steps: 150}"}});
  change = FindStepsChange(Diff(explicit_old, explicit_new), explicit_old,
                           explicit_new);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->new_span, 150);
  const std::string kept = absl::StrReplaceAll(
      longer, {{"warmup_steps: 10}", "warmup_steps: 10, total_steps: 100}"}});
  change = FindStepsChange(Diff(explicit_old, kept), explicit_old, kept);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->old_span, 100);
  EXPECT_EQ(change->new_span, 100);

  // Without a schedule: constant, nothing spans the run.
  const std::string constant = Edit({{"steps: 100,", "steps: 50,"}});
  change = FindStepsChange(Diff(kBase, constant), kBase, constant);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->schedule_kind, "constant");
  EXPECT_EQ(change->new_steps, 50);
  EXPECT_EQ(change->new_span, 0);

  // Anything else that differs, the schedule length alone, or no change.
  const std::string and_lr =
      absl::StrReplaceAll(longer, {{"lr: 0.001", "lr: 0.002"}});
  EXPECT_FALSE(FindStepsChange(Diff(cosine, and_lr), cosine, and_lr));
  const std::string only_total = absl::StrReplaceAll(
      cosine, {{"warmup_steps: 10}", "warmup_steps: 10, total_steps: 300}"}});
  EXPECT_FALSE(FindStepsChange(Diff(cosine, only_total), cosine, only_total));
  EXPECT_FALSE(FindStepsChange(Diff(kBase, kBase), kBase, kBase));
  const std::string not_int = Edit({{"steps: 100,", "steps: lots,"}});
  EXPECT_FALSE(FindStepsChange(Diff(kBase, not_int), kBase, not_int));
}

}  // namespace
}  // namespace conveyor::job
