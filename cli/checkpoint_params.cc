#include "cli/checkpoint_params.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/directory.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"

namespace conveyor::cli {

namespace fs = std::filesystem;

const engine::TensorInfo* CheckpointParams::Find(
    const std::string& name, const engine::SafetensorsReader** file) const {
  auto it = owner.find(name);
  if (it == owner.end()) return nullptr;
  *file = &stages[it->second].tensors;
  return (*file)->Find(name);
}

absl::StatusOr<CheckpointParams> LoadCheckpointParams(
    const std::string& dir, std::optional<int64_t> step) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                   checkpoint::ListCheckpointSteps(dir));
  if (steps.empty()) {
    std::string hint;
    std::error_code ec;
    if (fs::exists(fs::path(dir) / "params.safetensors", ec)) {
      hint =
          "; its params.safetensors (from run --in-process) is already one "
          "file";
    }
    return absl::NotFoundError(
        absl::StrCat(dir, ": no step-<N> directories", hint));
  }
  CheckpointParams params;
  // Checksums are verified: what is read here is then trusted elsewhere, so
  // a damaged file must stop it here.
  if (step.has_value()) {
    if (!std::binary_search(steps.begin(), steps.end(), *step)) {
      return absl::NotFoundError(absl::StrCat(
          dir, ": no step-", *step, "; steps: ", absl::StrJoin(steps, ", ")));
    }
    ASSIGN_OR_RETURN(params.manifest,
                     checkpoint::LoadCompleteCheckpoint(
                         dir, *step, /*verify_checksums=*/true));
  } else {
    // A job that stopped while saving leaves an incomplete newest step; the
    // one before it is still consistent.
    absl::StatusOr<checkpoint::LatestCheckpoint> latest =
        checkpoint::FindLatestCompleteCheckpoint(dir,
                                                 /*verify_checksums=*/true);
    if (absl::IsDataLoss(latest.status())) {
      return absl::DataLossError(absl::StrCat(
          latest.status().message(), "; use an older step with --step N"));
    }
    RETURN_IF_ERROR(latest.status());
    params.manifest = std::move(latest->manifest);
    params.skipped = std::move(latest->skipped);
  }
  const checkpoint::CheckpointManifest& m = params.manifest;
  // Every stage file, checked against the manifest and against stage 0's
  // job, so that a worker that wrote the wrong thing (another step, another
  // job) under the right name is caught.
  const std::string step_dir = checkpoint::StepDirPath(dir, m.step);
  checkpoint::StageFileExpectation expect{.step = m.step,
                                          .num_stages = m.num_stages};
  for (const checkpoint::StageFileDigest& digest : m.stages) {  // By stage.
    ASSIGN_OR_RETURN(checkpoint::StageFile file,
                     checkpoint::ReadStageFile(step_dir, digest, expect));
    if (!expect.job.has_value()) expect.job = file.info.job;
    params.stages.push_back(std::move(file));
  }
  params.job = expect.job.value_or("");
  for (int s = 0; s < static_cast<int>(params.stages.size()); ++s) {
    for (const engine::TensorInfo& info : params.stages[s].tensors.tensors()) {
      // Optimizer state is for resuming a run, not part of the model.
      if (checkpoint::IsOptimizerTensor(info.name)) continue;
      auto [it, inserted] = params.owner.emplace(info.name, s);
      if (!inserted) {
        return absl::FailedPreconditionError(
            absl::StrCat(dir, ": step-", m.step, ": tensor '", info.name,
                         "' is in both stage-", it->second, " and stage-", s));
      }
    }
  }
  return params;
}

absl::StatusOr<std::vector<float>> CheckpointParamsSource::Read(
    const std::string& name, const engine::Shape& shape) const {
  auto it = params_.owner.find(name);
  if (it == params_.owner.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step-", params_.manifest.step, " has no parameter '",
                     name, "' (the model needs ", engine::ShapeString(shape),
                     "): is this the job that wrote the checkpoint?"));
  }
  const engine::SafetensorsReader& file = params_.stages[it->second].tensors;
  RETURN_IF_ERROR(engine::CheckInitTensor(file, name, shape));
  return file.ReadF32(name);
}

absl::Status CheckParamsMatchModel(const CheckpointParams& params,
                                   const std::string& dir,
                                   const engine::ModelSpec& model,
                                   const std::string& job_name) {
  constexpr size_t kMaxListed = 4;
  std::vector<std::string> problems;
  size_t total = 0;
  auto add = [&](std::string problem) {
    if (++total <= kMaxListed) problems.push_back(std::move(problem));
  };
  std::set<std::string> wanted;
  for (const engine::ParamSpec* p : model.Params()) {
    wanted.insert(p->name);
    const engine::SafetensorsReader* file = nullptr;
    const engine::TensorInfo* info = params.Find(p->name, &file);
    if (info == nullptr) {
      add(absl::StrCat(p->name, " ", engine::ShapeString(p->shape),
                       " is missing"));
    } else if (info->shape != p->shape) {
      add(absl::StrCat(p->name, " is ", engine::ShapeString(info->shape),
                       ", the model's ", engine::ShapeString(p->shape)));
    }
  }
  for (const auto& [name, stage] : params.owner) {
    if (!wanted.contains(name)) {
      add(absl::StrCat(name, " (stage ", stage, ") is not in the model"));
    }
  }
  if (total == 0) return absl::OkStatus();
  if (total > kMaxListed) {
    problems.push_back(absl::StrCat("and ", total - kMaxListed, " more"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      dir, " step-", params.manifest.step, " does not hold the parameters of ",
      job_name, "'s model: ", absl::StrJoin(problems, "; ")));
}

}  // namespace conveyor::cli
