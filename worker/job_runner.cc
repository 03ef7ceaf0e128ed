#include "worker/job_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/profiler.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::worker {
namespace {

std::string JoinNames(const std::vector<std::string>& names) {
  return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
}

absl::Status Mismatch(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("program/build mismatch: ", what,
                   " (the coordinator and this worker run different builds "
                   "or model code; refusing to train something else)"));
}

// A wildcard listen host accepts on every interface but means nothing to a
// peer dialing it; tell peers this machine's name instead.
absl::StatusOr<std::string> AdvertisedHost(absl::string_view listen_address) {
  const size_t colon = listen_address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("data address '", listen_address, "' is not host:port"));
  }
  const absl::string_view host = listen_address.substr(0, colon);
  if (!host.empty() && host != "0.0.0.0" && host != "[::]" && host != "::") {
    return std::string(host);
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) {
    return ErrnoError(errno, "gethostname", "advertise the data address");
  }
  return std::string(name);
}

absl::Status CreateDirectories(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return ErrnoError(ec.value(), dir.string(), "create directory");
  }
  return absl::OkStatus();
}

}  // namespace

std::string DescribeRank(const v1::JobProgram& program) {
  std::vector<int> stages;
  for (const v1::StageProgram& sp : program.stages()) {
    stages.push_back(sp.stage());
  }
  if (stages.empty()) return absl::StrCat("rank ", program.rank());
  return absl::StrCat("rank ", program.rank(),
                      stages.size() == 1 ? " (stage " : " (stages ",
                      absl::StrJoin(stages, ", "), ")");
}

absl::StatusOr<std::unique_ptr<JobRunner>> JobRunner::Create(
    const v1::JobProgram& program, const JobRunnerOptions& options) {
  const int p = program.num_ranks(), s = program.num_stages();
  if (p < 1 || program.rank() < 0 || program.rank() >= p || s < p ||
      s % p != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("program: rank ", program.rank(), " of ", p,
                     " ranks with ", s, " stages is inconsistent"));
  }
  if (program.steps() < 0 || program.recv_timeout_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "program: steps (", program.steps(), ") and recv_timeout_ms (",
        program.recv_timeout_ms(), ") must not be negative"));
  }
  // The same parser the coordinator validated the job with, so both sides
  // read the same model, data and optimizer from the same text.
  ASSIGN_OR_RETURN(engine::JobSpec job,
                   engine::ParseJobSpec(program.yaml(), program.file_name(),
                                        program.base_dir()));
  if (job.pipeline.auto_stages) {
    // The coordinator chose the cut from a profile; the YAML only says
    // "auto". Build checks each of this rank's stages against it as usual.
    const std::vector<int> cut(program.stage_begin().begin(),
                               program.stage_begin().end());
    if (absl::Status s = engine::SetStageBoundaries(&job.model, cut); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("program: stage_begin: ", s.message()));
    }
  }
  std::unique_ptr<JobRunner> runner(
      new JobRunner(program, std::move(job), engine::CpuBackend::Get()));
  RETURN_IF_ERROR(runner->Build(options));
  return runner;
}

absl::Status JobRunner::Build(const JobRunnerOptions& options) {
  on_checkpoint_ = options.on_checkpoint;
  const engine::ModelSpec& model = job_.model;
  const int p = program_.num_ranks(), rank = program_.rank();
  const int num_stages = program_.num_stages();
  if (model.num_stages != num_stages ||
      num_stages != p * job_.pipeline.virtual_stages) {
    return Mismatch(absl::StrCat(
        "the program has ", num_stages, " stages on ", p,
        " ranks; this build parses the job into ", model.num_stages,
        " stages with virtual_stages = ", job_.pipeline.virtual_stages));
  }
  std::vector<int> expected, got;
  for (int st = rank; st < num_stages; st += p) expected.push_back(st);
  for (const v1::StageProgram& sp : program_.stages()) {
    got.push_back(sp.stage());
  }
  if (got != expected) {
    return Mismatch(absl::StrCat("rank ", rank, " of ", p, " holds stages [",
                                 absl::StrJoin(expected, ", "),
                                 "], the program lists [",
                                 absl::StrJoin(got, ", "), "]"));
  }

  // Build, and check each stage against the coordinator's plan of it.
  std::vector<engine::Parameter*> params;
  for (const v1::StageProgram& sp : program_.stages()) {
    const int st = sp.stage();
    ASSIGN_OR_RETURN(std::unique_ptr<engine::Stage> stage,
                     engine::Stage::Create(backend_, model, st));
    const int first = model.stage_begin[st];
    const int num_layers = model.StageEnd(st) - first;
    if (first != sp.first_layer() || num_layers != sp.num_layers()) {
      return Mismatch(absl::StrCat(
          "stage ", st, ": the program has layers [", sp.first_layer(), ", ",
          sp.first_layer() + sp.num_layers(), "), this build has [", first,
          ", ", first + num_layers, ")"));
    }
    std::vector<std::string> built;
    for (engine::Parameter* param : stage->parameters()) {
      built.push_back(param->name);
      params.push_back(param);
    }
    std::vector<std::string> planned(sp.parameter_names().begin(),
                                     sp.parameter_names().end());
    // The same names, in any order: the spec lists a layer's parameters in
    // declaration order, a built layer in the order it uses them (a pre-norm
    // block's norm1 before its attention); names, not order, bind values.
    std::sort(built.begin(), built.end());
    std::sort(planned.begin(), planned.end());
    if (built != planned) {
      return Mismatch(absl::StrCat("stage ", st, ": the program's parameters ",
                                   JoinNames(planned), ", this build's ",
                                   JoinNames(built)));
    }
    stages_.push_back(std::move(stage));
  }

  // Initialize as InProcessTrainer does, so a pipelined job starts from the
  // same parameters as its reference.
  if (model.seed) {
    for (auto& stage : stages_) {
      RETURN_IF_ERROR(stage->InitializeFromSeed(*model.seed));
    }
  } else {
    ASSIGN_OR_RETURN(engine::SafetensorsReader file,
                     engine::SafetensorsReader::Open(model.init_from));
    for (auto& stage : stages_) RETURN_IF_ERROR(stage->LoadFrom(file));
  }
  ASSIGN_OR_RETURN(data_, engine::DataSource::Create(
                              job_.data, engine::ModelSampleShapes(model)));
  // Cosine total_steps defaults to the job's training.steps, exactly as in
  // the reference, or the learning rates would differ.
  engine::ResolveSchedule(job_.optimizer, job_.training.steps);
  ASSIGN_OR_RETURN(optimizer_,
                   engine::Optimizer::Create(backend_, job_.optimizer, params));
  ASSIGN_OR_RETURN(actions_,
                   proto::ActionsFromProto(program_.actions(), num_stages));
  for (const scheduler::Action& a : actions_) {
    if (a.stage % p != rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("program: rank ", rank, " has no stage ", a.stage,
                       " for its action ", scheduler::ToString(a)));
    }
  }
  // Fail now, not after the last step, when the results cannot be written.
  if (!program_.checkpoint_dir().empty()) {
    RETURN_IF_ERROR(CreateDirectories(program_.checkpoint_dir()));
    if (job_.checkpoint.every > 0 || job_.checkpoint.keep_latest > 0) {
      SPDLOG_WARN(
          "job {}: checkpoint.every and keep_latest are not implemented by "
          "workers yet; writing the final parameters only",
          program_.job_id());
    }
  }

  ASSIGN_OR_RETURN(const std::string host,
                   AdvertisedHost(options.listen_address));
  ASSIGN_OR_RETURN(channel_, transport::TcpChannel::Create(
                                 {.rank = rank,
                                  .world_size = p,
                                  .listen_address = options.listen_address,
                                  .job = program_.job_number(),
                                  .secret = program_.secret(),
                                  .connect_timeout = options.connect_timeout,
                                  .observer = options.observer},
                                 backend_));
  data_endpoint_ = absl::StrCat(host, ":", channel_->port());

  if (program_.recv_timeout_ms() > 0) {
    recv_timeout_ = std::chrono::milliseconds(program_.recv_timeout_ms());
  }
  std::map<int, engine::Stage*> by_index;
  for (auto& stage : stages_) by_index[stage->index()] = stage.get();
  ASSIGN_OR_RETURN(
      executor_,
      StageExecutor::Create(
          {.job = program_.job_number(),
           .rank = rank,
           .num_ranks = p,
           .num_stages = num_stages,
           .batch_size = job_.training.batch_size,
           .microbatches = static_cast<int>(job_.training.microbatches),
           .loss = model.loss,
           .recv_timeout = recv_timeout_},
          std::move(by_index), data_.get(), optimizer_.get(), channel_.get(),
          backend_));
  return absl::OkStatus();
}

JobRunner::~JobRunner() = default;

std::vector<engine::Parameter*> JobRunner::parameters() const {
  std::vector<engine::Parameter*> all;
  for (const auto& stage : stages_) {
    for (engine::Parameter* p : stage->parameters()) all.push_back(p);
  }
  return all;
}

absl::Status JobRunner::Start(const std::vector<std::string>& peers) {
  if (cancelled_.load()) return CancelStatus();
  if (static_cast<int>(peers.size()) != program_.num_ranks()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("start: ", peers.size(), " peer endpoints for ",
                     program_.num_ranks(), " ranks")));
  }
  // Connect returns the abort status when Cancel aborts the channel while it
  // dials, so a cancel during a slow start is prompt too.
  return Fail(channel_->Connect(peers));
}

absl::Status JobRunner::Run(
    const std::function<void(const StepProgress&)>& on_step) {
  return Fail(RunSteps(on_step));
}

absl::Status JobRunner::RunSteps(
    const std::function<void(const StepProgress&)>& on_step) {
  const bool clip = job_.optimizer.clip_grad_norm.has_value();
  for (int64_t step = steps_done_.load(); step < program_.steps(); ++step) {
    if (cancelled_.load()) return CancelStatus();
    const double lr = optimizer_->current_lr();
    worker::AllReduceSum reduce = nullptr;
    if (clip) {
      reduce = [this, step](double x) { return AllReduceSum(step, x); };
    }
    ASSIGN_OR_RETURN(RankStepResult r,
                     executor_->RunStep(step, actions_, reduce));
    steps_done_.store(step + 1);
    if (on_step) {
      on_step({.step = step + 1,
               .seconds = r.seconds,
               .wait_seconds = r.wait_seconds,
               .has_loss = r.has_loss,
               .loss = r.loss,
               .learning_rate = lr,
               .peak_activation_bytes = r.peak_activation_bytes,
               .result = &r});
    }
  }
  if (cancelled_.load()) return CancelStatus();
  if (program_.checkpoint_dir().empty()) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  absl::Status written = WriteCheckpoint();
  if (on_checkpoint_) {
    on_checkpoint_(written.ok(), std::chrono::duration<double>(
                                     std::chrono::steady_clock::now() - start)
                                     .count());
  }
  return written;
}

// Every rank sends its value to every other rank under a tag no stage uses
// (stage = num_stages + sender), then adds all P values in rank order: the
// same additions in the same order on every rank, so every rank clips with
// the bitwise-same norm. f64 keeps the sum of squares as exact as the
// optimizer computed it.
absl::StatusOr<double> JobRunner::AllReduceSum(int64_t step, double value) {
  const int p = program_.num_ranks(), rank = program_.rank();
  auto tag_of = [&](int sender) {
    return transport::Tag{.job = program_.job_number(),
                          .step = step,
                          .microbatch = 0,
                          .stage = program_.num_stages() + sender,
                          .kind = transport::TensorKind::kActivation};
  };
  if (p > 1) {
    ASSIGN_OR_RETURN(engine::Tensor mine,
                     backend_->Empty({1}, engine::DType::kF64));
    RETURN_IF_ERROR(backend_->CopyFromHost(&value, sizeof(value), mine));
    for (int r = 0; r < p; ++r) {
      if (r != rank) RETURN_IF_ERROR(channel_->Send(r, tag_of(rank), mine));
    }
  }
  double total = 0;
  for (int r = 0; r < p; ++r) {
    if (r == rank) {
      total += value;
      continue;
    }
    ASSIGN_OR_RETURN(engine::Tensor t,
                     channel_->Recv(tag_of(r), recv_timeout_));
    if (t.dtype() != engine::DType::kF64 || t.numel() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient-norm reduction: rank ", r, " sent ",
                       engine::DTypeName(t.dtype()),
                       engine::ShapeString(t.shape()), ", expected F64[1]"));
    }
    double v = 0;
    RETURN_IF_ERROR(backend_->CopyToHost(t, &v, sizeof(v)));
    total += v;
  }
  return total;
}

absl::Status JobRunner::WriteCheckpoint() {
  const int64_t step = steps_done_.load();
  for (const auto& stage : stages_) {
    const std::string path =
        engine::StageFilePath(program_.checkpoint_dir(), step, stage->index());
    RETURN_IF_ERROR(
        CreateDirectories(std::filesystem::path(path).parent_path()));
    // SaveParameters writes atomically, so conveyorctl export never reads a
    // half-written stage file.
    RETURN_IF_ERROR(engine::SaveParameters(
        backend_, stage->parameters(), path,
        {{"job", job_.name},
         {"stage", absl::StrCat(stage->index())},
         {"num_stages", absl::StrCat(program_.num_stages())},
         {"step", absl::StrCat(step)},
         {"format", engine::kStageFileFormat}}));
    SPDLOG_INFO("job {}: wrote {}", program_.job_id(), path);
  }
  return absl::OkStatus();
}

void JobRunner::Cancel(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_.load()) return;
    cancel_status_ = status.ok() ? absl::CancelledError("cancelled") : status;
    cancelled_.store(true);
  }
  // Outside the lock: Abort only posts to the channel's I/O thread, but
  // nothing here needs mu_ held for it.
  channel_->Abort(status.ok() ? absl::CancelledError("cancelled") : status);
}

absl::Status JobRunner::CancelStatus() const {
  absl::MutexLock lock(&mu_);
  return cancel_status_;
}

absl::Status JobRunner::Fail(absl::Status status) {
  if (status.ok()) return status;
  // After Cancel, the step's error is only the echo of the abort: report
  // the cancel itself.
  if (cancelled_.load()) return CancelStatus();
  channel_->Abort(status);
  return status;
}

}  // namespace conveyor::worker
