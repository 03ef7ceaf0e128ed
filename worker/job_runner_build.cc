// JobRunner::Create (worker/job_runner.h): this rank's part of the program
// built and checked against this build's plan, its host memory checked,
// parameters initialized (or loaded from the resume files,
// job_runner_checkpoint.cc), the data, optimizer, data plane and executor
// set up. Starting and running the job is in job_runner.cc.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auth_token.h"
#include "common/cancellation.h"
#include "common/file.h"
#include "common/host_memory.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/parallel.h"
#include "engine/mesh_collective.h"
#include "engine/mesh_stage.h"
#include "engine/tensor_parallel_stage.h"
#include "job/model_init.h"
#include "job/rank_program.h"
#include "job/trainer.h"
#include "spdlog/spdlog.h"
#include "worker/internal/job_runner_internal.h"
#include "worker/job_runner.h"

namespace conveyor::worker {
namespace {

using job_runner_internal::CreateDirectories;

std::string JoinNames(const std::vector<std::string>& names) {
  return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
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

}  // namespace

absl::StatusOr<std::unique_ptr<JobRunner>> JobRunner::Create(
    const v1::JobProgram& program, const JobRunnerOptions& options) {
  // The program must be what this build compiles from the same job and
  // cut (job/rank_program.h): the coordinator and this worker then run the
  // same stages, parameters and actions.
  // Its actions are the plan's, already decoded and validated.
  ASSIGN_OR_RETURN(job::JobPlan plan,
                   job::PlanOfProgram(program, options.parsed.get()));
  job::JobSpec job = std::move(plan.job);
  std::vector<scheduler::Action> actions =
      std::move(plan.schedule.actions[program.rank()]);
  engine::Backend* backend = engine::CpuBackend::Get(job.training.precision);
  if (options.backends != nullptr) {
    ASSIGN_OR_RETURN(backend, options.backends->Get(job.training.precision));
  }
  std::unique_ptr<JobRunner> runner(new JobRunner(
      program, std::move(job), std::move(actions), backend, options.backends));
  runner->placement_ = plan.schedule.placement;
  if (plan.eval_schedule.has_value()) {
    runner->eval_actions_ =
        std::move(plan.eval_schedule->actions[program.rank()]);
  }
  RETURN_IF_ERROR(runner->Build(options));
  return runner;
}

absl::Status JobRunner::CheckParametersFitHostMemory() const {
  uint64_t elements = 0;
  std::vector<int> stages;
  for (const v1::StageProgram& sp : program_.stages()) {
    stages.push_back(sp.stage());
    for (const engine::ParamSpec* p : job_.model.StageParams(sp.stage())) {
      elements += static_cast<uint64_t>(p->NumElements());
    }
  }
  // The optimizer's state per parameter: Adam's two moments, SGD's momentum
  // buffer.
  uint64_t state = 0;
  if (job_.optimizer.kind != engine::OptimizerConfig::Kind::kSgd) {
    state = 2;
  } else if (job_.optimizer.momentum != 0) {
    state = 1;
  }
  // With checkpoints, the background writer's snapshot holds one more copy
  // of the values and the state, in host memory whatever the device.
  const uint64_t snapshot = program_.checkpoint_dir().empty() ? 0 : 1 + state;
  // Each parameter: its value and gradient, plus the optimizer's state, on
  // every mesh device. On a GPU the device allocator reports its own
  // out-of-memory as a status; host memory is allocated lazily and a job too
  // large for it would bring the OOM killer (or std::bad_alloc) onto the
  // worker.
  uint64_t copies = snapshot;
  std::string what = "checkpoint snapshot";
  if (backend_->host_resident()) {
    copies +=
        (2 + state) * static_cast<uint64_t>(job_.pipeline.devices_per_stage);
    what = snapshot > 0
               ? "values, gradients, optimizer state, checkpoint snapshot"
               : "values, gradients, optimizer state";
  }
  if (copies == 0) return absl::OkStatus();
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(elements, copies * sizeof(float), &bytes)) {
    bytes = ~uint64_t{0};
  }
  if (absl::Status s = CheckHostAllocation(
          bytes,
          absl::StrCat("rank ", program_.rank(), "'s stages [",
                       absl::StrJoin(stages, ", "), "] with ", elements,
                       " parameters (", copies, " floats each: ", what, ")"));
      !s.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        s.message(),
        "; make the model's layers smaller, cut it into more stages over "
        "more workers, or use an optimizer with less state"));
  }
  return absl::OkStatus();
}

absl::Status JobRunner::CheckActivationsFitHostMemory() const {
  if (!backend_->host_resident()) {
    return absl::OkStatus();  // As for the parameters.
  }
  const engine::ModelSpec& model = job_.model;
  const uint64_t microbatch =
      static_cast<uint64_t>(job_.training.microbatch_size());
  // Per stage, what one microbatch keeps from its forward to its backward,
  // saturating: sizes come from the job.
  std::map<int, uint64_t> per_microbatch;
  auto elements = [](const std::vector<int64_t>& shape) {
    uint64_t n = 1;
    for (int64_t d : shape) {
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
        return ~uint64_t{0};
      }
    }
    return n;
  };
  auto add = [](uint64_t& total, uint64_t n) {
    if (__builtin_add_overflow(total, n, &total)) total = ~uint64_t{0};
  };
  for (const v1::StageProgram& sp : program_.stages()) {
    const int st = sp.stage();
    uint64_t kept = 0;
    if (model.remat) {
      kept = elements(model.layers[model.stage_begin[st]].input_shape);
    } else {
      for (int l = model.stage_begin[st]; l < model.StageEnd(st); ++l) {
        add(kept, elements(model.layers[l].output_shape));
      }
    }
    // The first stage also keeps its microbatches' inputs, which it makes
    // rather than receives, and the last their targets (ids count twice: 8
    // bytes). A 16 GiB input once passed this check and the job died on a
    // neighbour's 30 s receive timeout instead.
    if (st == 0) {
      const uint64_t n = elements(model.input_shape);
      add(kept, n);
      if (model.token_input) add(kept, n);
    }
    if (st == model.num_stages - 1) {
      const uint64_t n = elements(model.target_shape);
      add(kept, n);
      if (model.integer_targets) add(kept, n);
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(kept, microbatch * sizeof(float), &bytes)) {
      bytes = ~uint64_t{0};
    }
    per_microbatch[st] = bytes;
  }
  // The schedule's peak: microbatches forwarded and not yet backwarded.
  uint64_t live = 0, peak = 0;
  int peak_microbatches = 0, in_flight = 0;
  for (const scheduler::Action& a : actions_) {
    const uint64_t bytes = per_microbatch[a.stage];
    if (a.op == scheduler::Op::kForward) {
      live = live > ~uint64_t{0} - bytes ? ~uint64_t{0} : live + bytes;
      ++in_flight;
    } else if (a.op != scheduler::Op::kBackwardWeight) {
      live -= std::min(live, bytes);
      --in_flight;
    }
    if (live > peak) {
      peak = live;
      peak_microbatches = in_flight;
    }
  }
  if (absl::Status s = CheckHostAllocation(
          peak,
          absl::StrCat(
              DescribeRank(program_), "'s activations (", peak_microbatches,
              peak_microbatches == 1 ? " microbatch of " : " microbatches of ",
              microbatch, " samples in flight at the schedule's peak)"));
      !s.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        s.message(),
        "; use more training.microbatches (smaller microbatches), a smaller "
        "training.batch_size, model.remat: true, or more stages"));
  }
  return absl::OkStatus();
}

absl::Status JobRunner::Build(const JobRunnerOptions& options) {
  on_checkpoint_ = options.on_checkpoint;
  observer_ = options.observer;
  TEST_checkpoint_delay_ = options.TEST_checkpoint_delay;
  check_tied_ = options.check_tied.value_or(kDebugBuild);
  const engine::ModelSpec& model = job_.model;
  const int p = program_.num_ranks(), rank = program_.rank();

  // pipeline.devices_per_stage > 1: each stage runs data parallel over that
  // many devices of this worker (engine/mesh_stage.h).
  const int devices = static_cast<int>(job_.pipeline.devices_per_stage);
  if (devices > 1) {
    if (backends_ != nullptr) {
      if (devices > backends_->size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "pipeline.devices_per_stage is ", devices, " but this worker has ",
            backends_->size(), " device(s) (--devices)"));
      }
      ASSIGN_OR_RETURN(mesh_, backends_->CreateMeshCollective(
                                  devices, job_.training.precision));
    } else {
      // No device list: a CPU mesh, as in tests.
      ASSIGN_OR_RETURN(mesh_,
                       engine::CreateHostMeshCollective(
                           std::vector<engine::Backend*>(devices, backend_)));
    }
  }

  // Tensor-parallel ranks run at once, one thread each: on a CPU mesh each
  // rank's kernels get its device's share of the cores, not all of them
  // (restored when the job ends).
  if (job_.pipeline.tensor_parallel > 1 && backend_->host_resident()) {
    cpu_threads_before_ = engine::CpuThreads();
    engine::SetCpuThreads(std::max(1, cpu_threads_before_ / devices));
  }

  // JobReady's peak, the MFU's denominator: the operator's figure where
  // given, else what each device's backend knows; unknown (0) if any is.
  peak_flops_ = 0;
  if (options.peak_flops_per_device > 0) {
    peak_flops_ = options.peak_flops_per_device * devices;
  } else {
    for (int d = 0; d < devices; ++d) {
      const engine::Backend* device = backend_;
      if (backends_ != nullptr) {
        ASSIGN_OR_RETURN(device, backends_->Get(d, job_.training.precision));
      }
      const double peak = device->peak_flops();
      if (!(peak > 0)) {
        peak_flops_ = 0;
        break;
      }
      peak_flops_ += peak;
    }
  }

  RETURN_IF_ERROR(CheckParametersFitHostMemory());

  // Build, and check each stage against the coordinator's plan of it.
  std::vector<engine::Parameter*> params;
  for (const v1::StageProgram& sp : program_.stages()) {
    const int st = sp.stage();
    std::unique_ptr<engine::PipelineStage> stage;
    if (mesh_ != nullptr && job_.pipeline.tensor_parallel > 1) {
      ASSIGN_OR_RETURN(
          stage, engine::TensorParallelStage::Create(
                     mesh_.get(), model, st, job_.pipeline.tensor_parallel));
    } else if (mesh_ != nullptr) {
      ASSIGN_OR_RETURN(stage,
                       engine::MeshStage::Create(mesh_.get(), model, st));
    } else {
      ASSIGN_OR_RETURN(stage, engine::Stage::Create(backend_, model, st));
    }
    std::vector<std::string> built;
    for (engine::Parameter* param : stage->parameters()) {
      built.push_back(param->name);
      params.push_back(param);
    }
    std::vector<std::string> planned(sp.parameter_names().begin(),
                                     sp.parameter_names().end());
    // The program matches this build's plan (Create); what is checked here
    // is that the layers built the parameters the spec lists for them. The
    // same names, in any order: the spec lists a layer's parameters in
    // declaration order, a built layer in the order it uses them (a pre-norm
    // block's norm1 before its attention); names, not order, bind values.
    std::sort(built.begin(), built.end());
    std::sort(planned.begin(), planned.end());
    if (built != planned) {
      return absl::InternalError(absl::StrCat(
          "stage ", st, ": the spec lists the parameters ", JoinNames(planned),
          ", the built layers have ", JoinNames(built)));
    }
    stages_.push_back(std::move(stage));
  }

  // Allocating and zeroing gigabytes of parameters takes seconds; the
  // init, the file reads and the data below poll the cancellation inside.
  RETURN_IF_ERROR(CheckCancelled());
  // Initialize as InProcessTrainer does, so a pipelined job starts from the
  // same parameters as its reference; a resumed one loads them below.
  if (program_.resume_step() > 0) {
    // Nothing to initialize: every parameter comes from the checkpoint.
  } else {
    std::vector<engine::PipelineStage*> stages;
    for (auto& stage : stages_) stages.push_back(stage.get());
    RETURN_IF_ERROR(job::InitializeStages(model, stages));
  }
  ASSIGN_OR_RETURN(data_, engine::DataSource::Create(
                              job_.data, job::ModelSampleShapes(model)));
  if (job_.eval.enabled) {
    ASSIGN_OR_RETURN(eval_data_, job::CreateEvalDataSource(job_));
  }
  // Cosine total_steps defaults to the job's training.steps, exactly as in
  // the reference, or the learning rates would differ.
  engine::ResolveSchedule(job_.optimizer, job_.training.steps);
  ASSIGN_OR_RETURN(optimizer_,
                   engine::Optimizer::Create(backend_, job_.optimizer, params));
  if (program_.resume_step() > 0) RETURN_IF_ERROR(LoadResumeFiles());
  actions_.resize(
      actions_.size() -
      std::clamp<size_t>(options.TEST_drop_last_actions, 0, actions_.size()));
  RETURN_IF_ERROR(CheckActivationsFitHostMemory());
  // Fail now, not after the last step, when the results cannot be written.
  if (!program_.checkpoint_dir().empty()) {
    RETURN_IF_ERROR(CreateDirectories(program_.checkpoint_dir()));
  }

  ASSIGN_OR_RETURN(const std::string host,
                   AdvertisedHost(options.listen_address));
  absl::StatusOr<std::string> secret = DataPlaneSecret(
      options.auth_token, program_.secret(), program_.job_number());
  if (!secret.ok()) {
    return absl::Status(secret.status().code(),
                        absl::StrCat("program: ", secret.status().message()));
  }
  ASSIGN_OR_RETURN(channel_, transport::TcpChannel::Create(
                                 {.rank = rank,
                                  .world_size = p,
                                  .listen_address = options.listen_address,
                                  .job = program_.job_number(),
                                  .secret = *std::move(secret),
                                  .connect_timeout = options.connect_timeout,
                                  .observer = options.observer},
                                 backend_));
  data_endpoint_ = absl::StrCat(host, ":", channel_->port());

  if (program_.recv_timeout_ms() > 0) {
    recv_timeout_ = std::chrono::milliseconds(program_.recv_timeout_ms());
  }
  RETURN_IF_ERROR(CreateExecutor(channel_.get()));

  // What JobReady reports for the coordinator's choice of data plane.
  connect_timeout_ = options.connect_timeout;
  if (backends_ != nullptr && backends_->cuda_device() >= 0) {
    absl::StatusOr<std::string> uuid = backends_->device_uuid(0);
    if (uuid.ok()) {
      device_uuid_ = *std::move(uuid);
    } else {
      // Without it the coordinator cannot rule out two ranks on this GPU;
      // it keeps the job on TCP, which always works.
      SPDLOG_WARN("{}: no GPU UUID ({}); the job's tensors stay on TCP",
                  DescribeRank(program_), uuid.status().ToString());
    }
    nccl_ = !device_uuid_.empty() && backends_->nccl_available();
  }
  return absl::OkStatus();
}

absl::Status JobRunner::CreateExecutor(transport::Channel* channel) {
  std::map<int, engine::PipelineStage*> by_index;
  for (auto& stage : stages_) by_index[stage->index()] = stage.get();
  ASSIGN_OR_RETURN(
      executor_,
      StageExecutor::Create(
          {.job = program_.job_number(),
           .rank = program_.rank(),
           .num_ranks = program_.num_ranks(),
           .placement = placement_,
           .num_stages = program_.num_stages(),
           .batch_size = job_.training.batch_size,
           .microbatches = static_cast<int>(job_.training.microbatches),
           .loss = job_.model.loss,
           .precision = job_.training.precision,
           .documents = job_.data.documents,
           .eval_documents = job_.eval.data.documents,
           .recv_timeout = recv_timeout_,
           .tied = job_.model.TiedParameters(),
           .check_tied = check_tied_},
          std::move(by_index), data_.get(), optimizer_.get(), channel,
          backend_));
  return absl::OkStatus();
}

}  // namespace conveyor::worker
