#include "worker/job_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "checkpoint/stage_file.h"
#include "common/auth_token.h"
#include "common/cancellation.h"
#include "common/file.h"
#include "common/host_memory.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/mesh_collective.h"
#include "engine/mesh_stage.h"
#include "engine/profiler.h"
#include "engine/safetensors.h"
#include "job/model_init.h"
#include "job/rank_program.h"
#include "job/trainer.h"
#include "spdlog/spdlog.h"

namespace conveyor::worker {
namespace {

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

absl::Status CreateDirectories(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return ErrnoError(ec.value(), dir.string(), "create directory");
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int> PipelinePeers(scheduler::Placement placement, int rank,
                               int num_ranks, int num_stages,
                               const std::vector<engine::TiedParameter>& tied) {
  std::vector<int> peers =
      scheduler::NeighbourRanks(placement, rank, num_ranks, num_stages);
  for (const engine::TiedParameter& tie : tied) {
    const int a =
        scheduler::StageRank(placement, tie.original_stage, num_ranks);
    const int b = scheduler::StageRank(placement, tie.copy_stage, num_ranks);
    if (a != b && (a == rank || b == rank)) peers.push_back(a == rank ? b : a);
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

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
    if (mesh_ != nullptr) {
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
           .recv_timeout = recv_timeout_,
           .tied = job_.model.TiedParameters(),
           .check_tied = check_tied_},
          std::move(by_index), data_.get(), optimizer_.get(), channel,
          backend_));
  return absl::OkStatus();
}

absl::Status JobRunner::JoinNccl() {
  if (backends_ == nullptr || !nccl_) {
    return absl::FailedPreconditionError(absl::StrCat(
        DescribeRank(program_),
        ": the coordinator put the job on NCCL, but this worker cannot use "
        "NCCL"));
  }
  const int p = program_.num_ranks(), rank = program_.rank();
  // The id names a bootstrap root in rank 0's process that waits until
  // every rank has joined, so it is made only now that the job uses it, and
  // travels as rank 0's first message to each rank, ahead of any header.
  std::string nccl_unique_id;
  if (rank == 0) {
    ASSIGN_OR_RETURN(nccl_unique_id, backends_->CreateNcclUniqueId());
    for (int r = 1; r < p; ++r) {
      RETURN_IF_ERROR(channel_->SendMessage(r, nccl_unique_id));
    }
  } else {
    ASSIGN_OR_RETURN(nccl_unique_id,
                     channel_->TakeMessage(0, connect_timeout_));
  }
  header_link_ =
      std::make_unique<transport::TcpHeaderLink>(channel_.get(), rank, p);
  NcclJoin join;
  join.rank = rank;
  join.world_size = p;
  join.unique_id = nccl_unique_id;
  join.job = program_.job_number();
  join.peers = PipelinePeers(placement_, rank, p, program_.num_stages(),
                             job_.model.TiedParameters());
  join.header_link = header_link_.get();
  join.precision = job_.training.precision;
  // Joining includes NCCL's bootstrap and connecting every peer (slower
  // across nodes than a TCP dial), so it gets at least the receive timeout.
  join.init_timeout = std::max(connect_timeout_, recv_timeout_);
  // A stalled NCCL group means a lost or hung peer: fail after as long as
  // a tensor may take to come.
  join.stall_timeout = recv_timeout_;
  join.observer = observer_;
  ASSIGN_OR_RETURN(std::unique_ptr<transport::Channel> nccl,
                   backends_->CreateNcclChannel(join));
  transport::Channel* channel = nccl.get();
  {
    absl::MutexLock lock(&mu_);
    if (cancellation_.cancelled()) {
      nccl->Abort(cancellation_.status());
      return cancellation_.status();
    }
    nccl_channel_ = std::move(nccl);
  }
  return CreateExecutor(channel);
}

JobRunner::~JobRunner() = default;

std::vector<engine::Parameter*> JobRunner::parameters() const {
  std::vector<engine::Parameter*> all;
  for (const auto& stage : stages_) {
    for (engine::Parameter* p : stage->parameters()) all.push_back(p);
  }
  return all;
}

absl::Status JobRunner::Start(const std::vector<std::string>& peers,
                              bool nccl) {
  if (cancellation_.cancelled()) return cancellation_.status();
  if (static_cast<int>(peers.size()) != program_.num_ranks()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("start: ", peers.size(), " peer endpoints for ",
                     program_.num_ranks(), " ranks")));
  }
  // Connect returns the abort status when Cancel aborts the channel while it
  // dials, so a cancel during a slow start is prompt too.
  RETURN_IF_ERROR(Fail(channel_->Connect(peers)));
  if (!nccl) return absl::OkStatus();
  return Fail(JoinNccl());
}

absl::Status JobRunner::Run(
    const std::function<void(const StepProgress&)>& on_step) {
  // Cancel aborts the channels, which wakes a blocked receive; the scope
  // stops what does not receive: a long `delay` layer, a step's data.
  CancellationScope scope(&cancellation_);
  return Fail(RunSteps(on_step));
}

absl::Status JobRunner::RunSteps(
    const std::function<void(const StepProgress&)>& on_step) {
  const bool clip = job_.optimizer.clip_grad_norm.has_value();
  const int64_t every = job_.checkpoint.every;
  drain_.Begin(steps_done_.load() + 1);
  for (int64_t step = steps_done_.load(); step < program_.steps(); ++step) {
    if (cancellation_.cancelled()) return cancellation_.status();
    const double lr = optimizer_->current_lr();
    worker::AllReduceSum reduce = nullptr;
    if (clip) {
      reduce = [this, step](double x) { return AllReduceSum(step, x); };
    }
    ASSIGN_OR_RETURN(RankStepResult r,
                     executor_->RunStep(step, actions_, reduce));
    const int64_t done = step + 1;
    steps_done_.store(done);
    // The evaluation belongs to the step it follows: reported with it, and
    // before its checkpoint, so a resume from that checkpoint never runs
    // it again.
    std::optional<RankEvalResult> eval;
    if (job_.eval.DueAfter(done, program_.steps())) {
      if (cancellation_.cancelled()) return cancellation_.status();
      ASSIGN_OR_RETURN(
          eval, executor_->RunEvaluation(done, eval_actions_, eval_data_.get(),
                                         job_.eval.batches));
    }
    if (on_step) {
      on_step({.step = done,
               .seconds = r.seconds,
               .wait_seconds = r.wait_seconds,
               .has_loss = r.has_loss,
               .loss = r.loss,
               .learning_rate = lr,
               .peak_activation_bytes = r.peak_activation_bytes,
               .result = &r,
               .eval = eval ? &*eval : nullptr});
    }
    // A drain stops after a step every rank agrees on, checkpointed
    // whatever checkpoint.every says, so no completed step is lost.
    ASSIGN_OR_RETURN(const bool stop,
                     drain_.AtBoundary(done, program_.steps(), cancellation_));
    if (!program_.checkpoint_dir().empty() &&
        (stop || done == program_.steps() ||
         (every > 0 && done % every == 0))) {
      if (cancellation_.cancelled()) return cancellation_.status();
      RETURN_IF_ERROR(WriteCheckpoint(done));
    }
    if (stop) {
      SPDLOG_INFO("{}: drained after step {}", program_.job_id(), done);
      break;
    }
  }
  if (cancellation_.cancelled()) return cancellation_.status();
  // The job ends once its last checkpoint is durable and reported.
  return checkpoint_writer_.Wait();
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
                          .stage = sender,
                          .kind = transport::TensorKind::kPartialSum};
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

namespace {

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

void JobRunner::Cancel(const absl::Status& status) {
  if (cancellation_.cancelled()) return;
  cancellation_.Cancel(status);
  AbortChannels(cancellation_.status());
}

void JobRunner::AbortChannels(const absl::Status& status) {
  // NCCL first, so a progress thread blocked in NCCL stops at once. The
  // peers hear the reason from the TCP channel's abort frames, which break
  // their header links with its code, failing their NCCL channels too.
  {
    absl::MutexLock lock(&mu_);
    if (nccl_channel_ != nullptr) nccl_channel_->Abort(status);
  }
  channel_->Abort(status);
}

absl::Status JobRunner::Fail(absl::Status status) {
  if (status.ok()) return status;
  // After Cancel, the step's error is only the echo of the abort: report
  // the cancel itself.
  if (cancellation_.cancelled()) return cancellation_.status();
  AbortChannels(status);
  return status;
}

}  // namespace conveyor::worker
