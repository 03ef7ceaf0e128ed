// Writes a committed checkpoint step as the workers and the coordinator do
// (a stage file per stage, then the manifest with the sizes and checksums),
// for the tests of the commands that read checkpoints (export, generate).
#ifndef CONVEYOR_TESTS_CLI_COMMITTED_CHECKPOINT_H_
#define CONVEYOR_TESTS_CLI_COMMITTED_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/stage_file.h"
#include "engine/model_spec.h"
#include "engine/safetensors.h"
#include "gtest/gtest.h"
#include "job/config_hash.h"

namespace conveyor::cli::testing_util {

// The `model:` section of a tiny two-stage Llama job (vocabulary 40, width
// 16, GQA 4/2), whose checkpoints these tests write and read.
inline constexpr char kLlamaModel[] = R"(model:
  input_shape: [8]
  init: {seed: 5}
  loss: cross_entropy
  layers:
    - embedding: {vocab_size: 40, features: 16}
    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 24, rope_theta: 1000}
    - boundary
    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 24, rope_theta: 1000}
    - rmsnorm
    - lm_head: {vocab_size: 40}
)";

// Step `step` of `model`'s checkpoint in `dir`: stage s holds its
// parameters with `values` (by name; every parameter must be there), job id
// "job-1"; the manifest records `config_hash`, and `job_yaml` with its
// training hash when given (as the coordinator records the job file; empty:
// as manifests written before it did).
inline void WriteCommittedStep(
    const std::string& dir, const engine::ModelSpec& model, int64_t step,
    const std::string& config_hash,
    const std::map<std::string, std::vector<float>>& values,
    const std::string& job_yaml = "") {
  checkpoint::CheckpointManifest m;
  m.job = "llama";
  m.job_id = "job-1";
  m.step = step;
  m.config_hash = config_hash;
  if (!job_yaml.empty()) {
    m.job_yaml = job_yaml;
    m.training_hash = job::JobTrainingHash(job_yaml);
  }
  m.num_stages = model.num_stages;
  m.stage_begin = model.stage_begin;
  m.created_unix_ms = 1;
  for (int s = 0; s < m.num_stages; ++s) {
    std::vector<engine::TensorToWrite> tensors;
    for (const engine::ParamSpec* p : model.StageParams(s)) {
      if (p->tied_copy) continue;  // Held once, as workers write it.
      const std::vector<float>& v = values.at(p->name);
      tensors.push_back({.name = p->name,
                         .dtype = engine::DType::kF32,
                         .shape = p->shape,
                         .data = v.data(),
                         .bytes = v.size() * sizeof(float)});
    }
    auto digest = checkpoint::WriteStageFile(dir,
                                             {.job = "job-1",
                                              .stage = s,
                                              .num_stages = m.num_stages,
                                              .step = step,
                                              .optimizer_step = step},
                                             tensors);
    ASSERT_TRUE(digest.ok()) << digest.status();
    m.stages.push_back(*digest);
  }
  ASSERT_TRUE(checkpoint::WriteManifest(dir, m).ok());
}

}  // namespace conveyor::cli::testing_util

#endif  // CONVEYOR_TESTS_CLI_COMMITTED_CHECKPOINT_H_
