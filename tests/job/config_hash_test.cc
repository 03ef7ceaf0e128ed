#include "job/config_hash.h"

#include <string>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::job {
namespace {

using ::testing::MatchesRegex;

TEST(JobConfigHashTest, IgnoresLayoutOrderAndTheBookkeepingSections) {
  const std::string base = R"(name: mlp
model:
  layers:
    - dense: {in: 4, out: 8}
    - relu
    - dense: {in: 8, out: 1}
optimizer: {kind: adam, lr: 0.001}
training: {steps: 10, batch_size: 8, microbatches: 2}
pipeline: {schedule: 1f1b}
)";
  const std::string hash = JobConfigHash(base);
  EXPECT_THAT(hash, MatchesRegex("[0-9a-f]{16}"));
  const std::vector<std::string> same = {
      // Comments and layout.
      R"(# A comment.
name: mlp   # trailing
model:
  layers: [{dense: {in: 4, out: 8}}, relu, {dense: {in: 8, out: 1}}]
optimizer:
  kind: adam
  lr: 0.001
training: {steps: 10, batch_size: 8, microbatches: 2}

pipeline: {schedule: 1f1b}
)",
      // Key order, top level and nested.
      R"(pipeline: {schedule: 1f1b}
training: {microbatches: 2, steps: 10, batch_size: 8}
optimizer: {lr: 0.001, kind: adam}
model:
  layers:
    - dense: {out: 8, in: 4}
    - relu
    - dense: {in: 8, out: 1}
name: mlp
)",
      // Another name, checkpoint policy, resume, restart, evaluation,
      // priority and owner.
      R"(name: renamed
model:
  layers:
    - dense: {in: 4, out: 8}
    - relu
    - dense: {in: 8, out: 1}
optimizer: {kind: adam, lr: 0.001}
training: {steps: 10, batch_size: 8, microbatches: 2}
pipeline: {schedule: 1f1b}
checkpoint: {dir: /elsewhere, every: 5, keep_latest: 2}
resume: latest
restart: {max_restarts: 3}
eval: {every: 2, data: {source: synthetic-regression, seed: 1}}
priority: urgent
owner: team-a
)",
  };
  for (const std::string& text : same) {
    EXPECT_EQ(JobConfigHash(text), hash) << text;
  }
}

TEST(JobConfigHashTest, ChangesWithWhatIsTrained) {
  const std::string base =
      "model: {layers: [{dense: {in: 4, out: 8}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 10}\n";
  const std::string hash = JobConfigHash(base);
  const std::vector<std::string> different = {
      // lr.
      "model: {layers: [{dense: {in: 4, out: 8}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.002}\n"
      "training: {steps: 10}\n",
      // A layer's width.
      "model: {layers: [{dense: {in: 4, out: 16}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 10}\n",
      // Layer order.
      "model: {layers: [relu, {dense: {in: 4, out: 8}}]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 10}\n",
      // A pipeline section.
      "model: {layers: [{dense: {in: 4, out: 8}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 10}\n"
      "pipeline: {schedule: gpipe}\n",
      // A value moved between keys must not collide.
      "model: {layers: [{dense: {in: 4, out: 8}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 1}\n"
      "data: {seed: 0}\n",
  };
  for (const std::string& text : different) {
    EXPECT_NE(JobConfigHash(text), hash) << text;
  }
}

// Checkpoints record the config hash, so it must never change for a job
// file that did not: this is the value every build since the hash was
// introduced computes for this text.
TEST(JobConfigHashTest, IsStableAcrossBuilds) {
  EXPECT_EQ(JobConfigHash("model: {layers: [{dense: {in: 4, out: 8}}, relu]}\n"
                          "pipeline: {schedule: 1f1b}\n"),
            "03be044f5376c3e9");
}

TEST(JobTrainingHashTest, IgnoresThePipelineLayoutOnly) {
  const std::string base = R"(name: mlp
model:
  layers:
    - dense: {in: 4, out: 8}
    - boundary
    - relu
    - repeat: 4
      boundary_every: 2
      layers: [{dense: {in: 8, out: 8}}]
    - dense: {in: 8, out: 1}
optimizer: {kind: adam, lr: 0.001}
training: {steps: 10, batch_size: 8, microbatches: 2}
pipeline: {schedule: 1f1b}
)";
  const std::string hash = JobTrainingHash(base);
  EXPECT_THAT(hash, MatchesRegex("[0-9a-f]{16}"));
  EXPECT_NE(hash, JobConfigHash(base));
  // Other cuts, schedules, stage counts and placements: the same training.
  const std::vector<std::string> same = {
      R"(name: mlp
model:
  layers:
    - dense: {in: 4, out: 8}
    - relu
    - boundary: {}
    - repeat: 4
      layers: [{dense: {in: 8, out: 8}}]
    - boundary
    - dense: {in: 8, out: 1}
optimizer: {kind: adam, lr: 0.001}
training: {steps: 10, batch_size: 8, microbatches: 2}
pipeline: {schedule: zb-v, virtual_stages: 2, devices_per_stage: 2}
)",
      R"(name: mlp
model:
  layers:
    - dense: {in: 4, out: 8}
    - relu
    - repeat: 4
      boundary_every: 1
      layers: [{dense: {in: 8, out: 8}}]
    - dense: {in: 8, out: 1}
optimizer: {kind: adam, lr: 0.001}
training: {steps: 10, batch_size: 8, microbatches: 2}
pipeline: {schedule: auto, stages: auto, workers: 3}
)",
  };
  for (const std::string& text : same) {
    EXPECT_EQ(JobTrainingHash(text), hash) << text;
    EXPECT_NE(JobConfigHash(text), JobConfigHash(base)) << text;
  }
  // What is trained: the model's layers, the optimizer, the training.
  const std::vector<std::string> different = {
      absl::StrReplaceAll(base, {{"out: 8}\n    - boundary", "out: 9}\n"}}),
      absl::StrReplaceAll(base, {{"repeat: 4", "repeat: 3"}}),
      absl::StrReplaceAll(base, {{"lr: 0.001", "lr: 0.002"}}),
      absl::StrReplaceAll(base, {{"microbatches: 2", "microbatches: 4"}}),
      // A layer kind named like a boundary is still a layer.
      absl::StrReplaceAll(base, {{"    - relu\n", "    - boundary2\n"}}),
  };
  for (const std::string& text : different) {
    EXPECT_NE(JobTrainingHash(text), hash) << text;
  }
}

TEST(JobConfigHashTest, HashesUnparseableTextAsIs) {
  const std::string a = JobConfigHash("model: [unclosed");
  EXPECT_THAT(a, MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(a, JobConfigHash("model: [unclosed"));
  EXPECT_NE(a, JobConfigHash("model: [unclosed "));
  // A self-referencing alias is cut off by the depth bound, not followed
  // forever.
  EXPECT_THAT(JobConfigHash("a: &x [*x]\n"), MatchesRegex("[0-9a-f]{16}"));
}

}  // namespace
}  // namespace conveyor::job
