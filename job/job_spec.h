// JobSpec: a whole training job as described in its YAML file: the model, the
// data, the optimizer, the training loop (steps, batch, microbatches), the
// pipeline schedule and the checkpoint policy.
//
// ```yaml
// name: mlp                       # optional; default: the file's stem
// model: {...}                    # see engine/model_spec.h
// data:
//   source: synthetic-regression  # or tensors, tokens, llmc, megatron
//   seed: 0
//   path: data/train.safetensors  # tensors, tokens, llmc; megatron: the
//                                 # prefix of .bin/.idx; relative to the
//                                 # job file
//   blend: [{path: a, weight: 0.3}, {path: b, weight: 0.7}]  # megatron,
//                                 # instead of path
//   shuffle: false
//   seq_len: 64                   # tokens, llmc, megatron
//   dtype: uint8                  # tokens: uint8, uint16, uint32, int32
//                                 # (uint16: true is dtype: uint16)
//   vocab_size: 256               # tokens, llmc, megatron
//   documents: {eod_token: 0, reset_position_ids: true,
//               document_mask: true, eod_mask_loss: true}
//                                 # tokens, llmc, megatron
//   noise: 0.1                    # synthetic-regression
// training: {steps: 100, batch_size: 64, microbatches: 4}
// optimizer:
//   kind: adam                    # sgd, adam, adamw
//   lr: 0.001
//   momentum: 0.9                 # sgd
//   nesterov: false               # sgd
//   dampening: 0                  # sgd
//   betas: [0.9, 0.999]           # adam, adamw
//   eps: 1.0e-8                   # adam, adamw
//   weight_decay: 0.0
//   clip_grad_norm: 1.0           # optional
//   schedule: {kind: cosine, warmup_steps: 10, total_steps: 100, min_lr: 0}
// pipeline:
//   schedule: 1f1b
//   virtual_stages: 1             # zb-v, dualpipev: 2 (their default)
//   stages: markers               # or auto: the coordinator profiles the
//                                 # layers and chooses the cuts
//   num_stages: 4                 # auto: how many stages (P * V)
//   workers: 4                    # schedule: auto (with stages: auto):
//                                 # P; the schedule, V and cut are chosen
//   memory_budget: 16GiB          # auto, optional: per device; bytes, or
//                                 # with a unit (KB MB GB, KiB MiB GiB)
// checkpoint: {dir: out/mlp, every: 0, keep_latest: 0}
// eval:                           # optional: evaluation under pipelining
//   every: 50                     # steps between evaluations; 0: only at
//                                 # the end (there is always one at the end)
//   batches: 4                    # K batches of training.batch_size
//   data: {...}                   # the validation data, as `data:`
// ```
// Every error is InvalidArgument "file:line:col: path: message".
// Thread-safe (pure functions).
#ifndef CONVEYOR_JOB_JOB_SPEC_H_
#define CONVEYOR_JOB_JOB_SPEC_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/data.h"
#include "engine/model_spec.h"
#include "engine/optimizer.h"
#include "engine/precision.h"
#include "job/job_policy.h"

namespace conveyor::job {

// Upper bound on a job file, so a hostile or mistaken input cannot make the
// parser allocate without limit.
inline constexpr int64_t kMaxJobFileBytes = 1 << 20;

struct TrainingSpec {
  int64_t steps = 1;
  int64_t batch_size = 1;    // Samples per step; a multiple of microbatches.
  int64_t microbatches = 1;  // M
  // How GEMMs round their inputs (engine/precision.h).
  engine::Precision precision = engine::Precision::kFp32;

  // Samples in one microbatch (the parser checks M divides the batch).
  int64_t microbatch_size() const {
    return batch_size / (microbatches > 0 ? microbatches : 1);
  }
};

// Upper bound on pipeline.num_stages with `stages: auto` (the partitioner's
// limit).
inline constexpr int64_t kMaxAutoStages = 1024;

struct PipelineSpec {
  // Validated against the schedule library by the planner, which reports
  // errors at `where`.
  std::string schedule = "1f1b";
  int64_t virtual_stages = 1;
  engine::SourceLocation where;
  // schedule: auto (needs stages: auto): the planner chooses the schedule,
  // virtual_stages and the cut together for `workers` ranks
  // (job/planner.h ChooseStages) and then sets `schedule`,
  // `virtual_stages` and `num_stages` to its choice; `schedule` is "auto"
  // only until then.
  bool auto_schedule = false;
  int64_t workers = 0;
  // stages: auto. The model's `boundary` markers, if any, stay as cuts the
  // search must keep; the planner checks num_stages against the model at
  // `num_stages_where`.
  bool auto_stages = false;
  int64_t num_stages = 0;          // With auto_stages, in 1..kMaxAutoStages.
  double memory_budget_bytes = 0;  // With auto_stages; 0: no budget.
  engine::SourceLocation num_stages_where;
  engine::SourceLocation memory_budget_where;
  // Devices each stage runs on, data parallel (engine/mesh_stage.h): every
  // microbatch is split evenly over them, so the parser checks this divides
  // the microbatch size; the planner places each stage on a worker with at
  // least this many devices (--devices) and reports at
  // devices_per_stage_where otherwise.
  int64_t devices_per_stage = 1;
  engine::SourceLocation devices_per_stage_where;
  // Each stage's mesh runs as devices_per_stage / tensor_parallel replicas
  // of tensor_parallel ranks that split every layer that can split
  // (engine/tensor_parallel_stage.h; llama_block). The parser checks that
  // it divides devices_per_stage and every split layer's head and width
  // counts, and that some layer splits.
  int64_t tensor_parallel = 1;
  engine::SourceLocation tensor_parallel_where;
};

struct CheckpointSpec {
  std::string dir;    // Empty: no checkpoints; final parameters not written.
  int64_t every = 0;  // Steps between checkpoints; 0: only at the end.
  int64_t keep_latest = 0;  // 0: keep all.
};

// resume: latest | PATH. Where a job continues from: the newest complete
// checkpoint in checkpoint.dir, or the one at PATH (a step directory, or a
// checkpoint directory meaning its newest complete step). A job asked to
// resume never starts from scratch: no complete checkpoint is an error.
struct ResumeSpec {
  enum class Kind { kNone, kLatest, kPath };
  Kind kind = Kind::kNone;
  std::string path;  // kPath, resolved against the job's directory.
  engine::SourceLocation where;
};

// restart: {max_restarts: N}. A job that loses a worker (or fails on one) is
// re-planned on the live workers and resumes from its newest complete
// checkpoint, at most N times, instead of failing.
// restart: {max_restarts: N, elastic: {min_workers: K}}. Elastic: when a
// restart finds fewer live workers than the job's layout needs, the job is
// re-planned onto the live ones (at least K; job/planner.h RelayoutOnto)
// and resumes from its newest checkpoint instead of failing.
struct RestartSpec {
  int64_t max_restarts = 0;
  int64_t elastic_min_workers = 0;  // 0: not elastic.
};

// eval: {every: N, batches: K, data: {...}}. After every N-th step and after
// the last, a forward-only pass of K batches of the validation data through
// the same stages (worker/stage_executor.h RunEvaluation; the in-process
// trainer's Evaluate is its reference). Batch k is the data source's step k,
// training.batch_size samples in training.microbatches microbatches, so
// every evaluation sees the same samples and any two are comparable.
struct EvalSpec {
  bool enabled = false;  // The job has an eval section.
  int64_t every = 0;     // 0: only after the last step.
  int64_t batches = 1;   // K
  engine::DataConfig data;
  // The section, for the planner's errors (too many forwards to schedule).
  engine::SourceLocation where;

  // Whether an evaluation follows the step that brings the job to `done`
  // completed steps of `steps`.
  bool DueAfter(int64_t done, int64_t steps) const {
    return enabled && (done == steps || (every > 0 && done % every == 0));
  }
};

// The most microbatches one evaluation may run, K * M: the schedule
// generators' limit (scheduler/generators.h kMaxMicrobatches).
inline constexpr int64_t kMaxEvalMicrobatches = int64_t{1} << 20;

struct JobSpec {
  std::string name;
  engine::ModelSpec model;
  engine::DataConfig data;
  engine::OptimizerConfig optimizer;
  TrainingSpec training;
  PipelineSpec pipeline;
  CheckpointSpec checkpoint;
  ResumeSpec resume;
  RestartSpec restart;
  EvalSpec eval;
  // Scheduling policy (job/job_policy.h): priority: a class or an integer
  // (default normal), owner: whose quota the job counts against (empty:
  // none).
  int priority = kPriorityNormal;
  std::string owner;
};

// What one sample of `model` looks like, for the data source.
engine::SampleShapes ModelSampleShapes(const engine::ModelSpec& model);

// The data source of `job`'s eval section (DataSource::Create against the
// model's sample shapes), its errors prefixed "eval.data: ". Call only for a
// job with eval.enabled.
absl::StatusOr<std::unique_ptr<engine::DataSource>> CreateEvalDataSource(
    const JobSpec& job);

// Parses a job document. Relative paths (data.path, model.init.from,
// checkpoint.dir, resume) are resolved against `base_dir` when it is
// non-empty. ParseJob (job/parsed_job.h) is the same parse with the
// document's hashes; a process that needs those, or the spec more than
// once, keeps a ParsedJob instead of parsing again.
absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view yaml_text,
                                     absl::string_view file_name,
                                     absl::string_view base_dir = "");

// Reads and parses a job file (at most kMaxJobFileBytes), resolving relative
// paths against the file's directory.
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_JOB_SPEC_H_
