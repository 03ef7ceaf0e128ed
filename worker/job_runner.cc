#include "worker/job_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cancellation.h"
#include "common/status_macros.h"
#include "engine/cpu/parallel.h"
#include "spdlog/spdlog.h"

namespace conveyor::worker {

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

JobRunner::~JobRunner() {
  if (cpu_threads_before_ > 0) engine::SetCpuThreads(cpu_threads_before_);
}

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
  TakeStepMemory();  // Each step's peaks are its own, not the build's.
  for (int64_t step = steps_done_.load(); step < program_.steps(); ++step) {
    if (cancellation_.cancelled()) return cancellation_.status();
    const double lr = optimizer_->current_lr();
    worker::AllReduceSum reduce = nullptr;
    if (clip) {
      reduce = [this, step](double x) { return AllReduceSum(step, x); };
    }
    ASSIGN_OR_RETURN(RankStepResult r,
                     executor_->RunStep(step, actions_, reduce));
    r.memory = TakeStepMemory();
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

engine::MemoryStats JobRunner::TakeStepMemory() {
  std::vector<engine::Backend*> devices = {backend_};
  if (backends_ != nullptr) {
    // The mesh's devices, whose backends Build created (Get would create
    // one on a device the job does not use).
    for (int d = 1; d < job_.pipeline.devices_per_stage; ++d) {
      absl::StatusOr<engine::Backend*> b =
          backends_->Get(d, job_.training.precision);
      if (b.ok()) devices.push_back(*b);
    }
  }
  engine::MemoryStats fullest;
  for (engine::Backend* b : devices) {
    const engine::MemoryStats m = b->memory_stats();
    if (m.peak_reserved >= fullest.peak_reserved) fullest = m;
  }
  for (engine::Backend* b : devices) b->ResetPeakMemory();
  return fullest;
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
