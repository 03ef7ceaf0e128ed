// JobRunner's checkpoints (worker/job_runner.h): the stages snapshotted to
// host memory at a step boundary and written in the background, and, for a
// resumed program, loaded back from the files the manifest names.
#include <chrono>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/stage_file.h"
#include "common/cancellation.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "engine/safetensors.h"
#include "spdlog/spdlog.h"
#include "worker/internal/job_runner_internal.h"
#include "worker/job_runner.h"

namespace conveyor::worker {
namespace job_runner_internal {

absl::Status CreateDirectories(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return ErrnoError(ec.value(), dir.string(), "create directory");
  }
  return absl::OkStatus();
}

}  // namespace job_runner_internal

namespace {

using job_runner_internal::CreateDirectories;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

absl::Status JobRunner::WriteCheckpoint(int64_t step) {
  // At most one write in flight: the previous one finishes first, and its
  // error fails the job here.
  const auto wait_start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(checkpoint_writer_.Wait());
  const double waited = SecondsSince(wait_start);
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status snapshot = SnapshotStages(step); !snapshot.ok()) {
    if (on_checkpoint_) {
      CheckpointWrite failed;
      failed.step = step;
      failed.status = snapshot;
      failed.seconds = SecondsSince(start);
      failed.wait_seconds = waited;
      on_checkpoint_(failed);
    }
    return snapshot;
  }
  const double snapshot_seconds = SecondsSince(start);
  // The step loop goes on while the files are written: the snapshot is the
  // step's state, whatever the next steps do to the stages. Only the writer
  // touches snapshot_ until the next Wait.
  return checkpoint_writer_
      .Start([this, step, start, waited, snapshot_seconds] {
        CheckpointWrite write;
        write.step = step;
        write.wait_seconds = waited;
        write.snapshot_seconds = snapshot_seconds;
        absl::StatusOr<std::vector<v1::StageFile>> files =
            WriteSnapshot(step, snapshot_);
        write.seconds = SecondsSince(start);
        if (files.ok()) {
          write.files = *std::move(files);
        } else {
          write.status = files.status();
        }
        if (on_checkpoint_) on_checkpoint_(write);
        return write.status;
      })
      .status();
}

absl::StatusOr<std::vector<v1::StageFile>> JobRunner::WriteSnapshot(
    int64_t step, const std::vector<StageSnapshot>& snapshot) {
  std::vector<v1::StageFile> files;
  for (const StageSnapshot& stage : snapshot) {
    if (TEST_checkpoint_delay_.count() > 0) {
      // The step directory first, so a test sees the write begin and can
      // kill the worker in the middle of it.
      RETURN_IF_ERROR(CreateDirectories(
          checkpoint::StepDirPath(program_.checkpoint_dir(), step)));
      std::this_thread::sleep_for(TEST_checkpoint_delay_);
      if (cancellation_.cancelled()) return cancellation_.status();
    }
    ASSIGN_OR_RETURN(const checkpoint::StageFileDigest digest,
                     checkpoint::WriteStageFile(program_.checkpoint_dir(),
                                                stage.info, stage.tensors));
    v1::StageFile& file = files.emplace_back();
    file.set_stage(digest.stage);
    file.set_file(digest.file);
    file.set_bytes(digest.bytes);
    file.set_crc32c(digest.crc32c);
    SPDLOG_INFO("job {}: wrote {} ({} bytes)", program_.job_id(),
                checkpoint::StageFilePath(program_.checkpoint_dir(), step,
                                          stage.info.stage),
                digest.bytes);
  }
  return files;
}

absl::Status JobRunner::SnapshotStages(int64_t step) {
  RETURN_IF_ERROR(backend_->Synchronize());
  const std::vector<engine::Optimizer::StateTensor> state =
      optimizer_->StateTensors();
  // The buffers of the previous snapshot are reused: every checkpoint holds
  // the same tensors, so after the first one nothing is allocated (and no
  // page is faulted in) while the step loop stands still.
  snapshot_.resize(stages_.size());
  for (size_t k = 0; k < stages_.size(); ++k) {
    const auto& stage = stages_[k];
    StageSnapshot& s = snapshot_[k];
    s.info = {.job = job_.name,
              .stage = stage->index(),
              .num_stages = program_.num_stages(),
              .step = step,
              .optimizer_step = optimizer_->step(),
              .samples_seen = step * job_.training.batch_size};
    // Host copies of everything the file holds: the parameters under their
    // global names, then the optimizer's state of those parameters.
    std::vector<std::vector<float>>& host = s.host;
    std::vector<engine::TensorToWrite>& tensors = s.tensors;
    tensors.clear();
    auto add = [&](std::string name, const engine::Tensor& t) -> absl::Status {
      const size_t i = tensors.size();
      if (host.size() <= i) host.resize(i + 1);
      host[i].resize(t.numel());
      RETURN_IF_ERROR(backend_->CopyToHost(t, host[i].data(), t.bytes()));
      tensors.push_back({.name = std::move(name),
                         .dtype = engine::DType::kF32,
                         .shape = t.shape(),
                         .data = host[i].data(),
                         .bytes = t.bytes()});
      return absl::OkStatus();
    };
    std::set<const engine::Parameter*> mine;
    for (engine::Parameter* p : stage->parameters()) {
      // A tied copy is its original, held once by the original's file; the
      // copy's optimizer state equals the original's too (same gradients,
      // same updates), so a resumed copy reads both from there.
      if (p->tied_copy) continue;
      mine.insert(p);
      RETURN_IF_ERROR(add(p->name, p->value));
    }
    for (const engine::Optimizer::StateTensor& st : state) {
      if (!mine.contains(st.param)) continue;
      RETURN_IF_ERROR(add(
          checkpoint::OptimizerTensorName(st.slot, st.param->name), st.tensor));
    }
    // Tensors a later snapshot no longer holds (none so far) free their
    // buffers.
    host.resize(tensors.size());
  }
  return absl::OkStatus();
}

absl::Status JobRunner::LoadResumeFiles() {
  const int64_t step = program_.resume_step();
  // The files holding this rank's parameters, the originals of its tied
  // copies included, whatever cut wrote them (rank_program.h): each
  // parameter and its optimizer state is read by its global name. Every
  // file stays open (in memory) until the optimizer state is read.
  std::vector<checkpoint::StageFile> files;
  std::set<int> read;
  for (const v1::StageFile& f : program_.resume_files()) {
    if (!read.insert(f.stage()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("program: two resume files for stage ", f.stage()));
    }
    ASSIGN_OR_RETURN(checkpoint::StageFile file,
                     checkpoint::ReadStageFile(program_.resume_dir(),
                                               {.stage = f.stage(),
                                                .file = f.file(),
                                                .bytes = f.bytes(),
                                                .crc32c = f.crc32c()},
                                               {.step = step}));
    files.push_back(std::move(file));
  }
  std::vector<const engine::SafetensorsReader*> readers;
  for (const checkpoint::StageFile& f : files) readers.push_back(&f.tensors);
  const engine::SafetensorsFilesSource source(std::move(readers));
  // The files passed their checksums and the configuration matched the
  // manifest's training hash: a tensor missing now is a checkpoint written
  // by something else under this job's name.
  auto explain = [&](const absl::Status& s) {
    if (s.ok()) return s;
    return absl::Status(
        s.code(),
        absl::StrCat("resuming from step ", step, " (", program_.resume_dir(),
                     "): ", s.message(),
                     "; the checkpoint does not hold every parameter of this "
                     "rank's stages with its optimizer state: resume from "
                     "another step (resume: N) or start afresh elsewhere"));
  };
  for (const auto& stage : stages_) {
    RETURN_IF_ERROR(explain(stage->LoadFrom(source)));
  }
  // A tied copy's state is its original's, from the file holding the
  // original (the two are stepped alike).
  RETURN_IF_ERROR(explain(optimizer_->RestoreState(
      step,
      [&](absl::string_view slot, const engine::Parameter& param)
          -> absl::StatusOr<std::vector<float>> {
        const engine::SafetensorsReader* file = source.FileOf(param.name);
        if (file == nullptr) {
          return absl::InternalError(absl::StrCat(
              "resume: no file holds ", param.name, " after loading it"));
        }
        return file->ReadF32(checkpoint::OptimizerTensorName(slot, param.name));
      })));
  steps_done_.store(step);
  SPDLOG_INFO("job {}: resumed {} from step {} in {}", program_.job_id(),
              DescribeRank(program_), step, program_.resume_dir());
  return absl::OkStatus();
}

}  // namespace conveyor::worker
