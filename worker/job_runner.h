// JobRunner: one worker's part of one job, from the coordinator's program to
// the final checkpoint, with no knowledge of the control-plane stream.
//
// Life of a job on a worker:
//   Create(program)  parses the job's YAML with the coordinator's parser,
//                    builds exactly this rank's stages and refuses a program
//                    its build disagrees with (FailedPrecondition
//                    "program/build mismatch ..."), initializes parameters,
//                    opens the data source and optimizer, and binds the data
//                    plane (TcpChannel) so data_endpoint() can be reported.
//   Start(peers)     connects to every other rank of the job.
//   Run(on_step)     runs the steps from program.resume_step to
//                    program.steps, each followed by its evaluation when
//                    the job's eval section has one due, calls on_step
//                    after each, and writes this rank's stages to the
//                    checkpoint directory every checkpoint.every steps and
//                    after the last, or stops early for a drain
//                    (RequestStop/StopAfter).
//   Cancel(status)   from any thread: aborts the data plane at once (which
//                    wakes a blocked Recv or Connect and tells the peers why),
//                    cancels what Run's thread waits on or loops over
//                    (common/cancellation.h: a `delay` layer, a step's data)
//                    and makes Run/Start return `status`. Create is cancelled
//                    through the cancellation its caller installs.
// Any failure of Start or Run aborts the channel with the failure, so the
// other ranks stop with the original reason instead of a timeout.
//
// Checkpoints. A checkpoint of step N holds, per stage, the parameters and
// the optimizer's state (checkpoint/stage_file.h), so that a run resumed from
// it ends bitwise equal to one that never stopped: the data source is indexed
// by step (N is the data position) and training draws no random numbers
// after initialization, so nothing else carries over. At the step boundary
// the stages are copied to host memory (a snapshot); the files are written
// from it on a background thread while the next steps run, each to a
// temporary name, fsynced and renamed; on_checkpoint then reports the files'
// sizes and CRC-32C, for the coordinator's manifest. At most one write is in
// flight: the next checkpoint waits for it (CheckpointWrite.wait_seconds),
// and Run returns only once the last is reported. A program with
// resume_step > 0 starts from the files in resume_dir instead of the init,
// after checking each against the size and CRC the manifest recorded.
//
// Thread-safety: Start and Run are called from one thread (the job thread);
// Cancel, data_endpoint and the accessors from any thread. The session
// reports through the on_step callback, so this class needs no coordinator
// and is tested with real channels on loopback.
#ifndef CONVEYOR_WORKER_JOB_RUNNER_H_
#define CONVEYOR_WORKER_JOB_RUNNER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/stage_file.h"
#include "common/cancellation.h"
#include "conveyor/v1/conveyor.pb.h"
#include "engine/backend.h"
#include "engine/data.h"
#include "engine/mesh_collective.h"
#include "engine/optimizer.h"
#include "engine/pipeline_stage.h"
#include "engine/safetensors.h"
#include "engine/stage.h"
#include "job/job_spec.h"
#include "job/parsed_job.h"
#include "scheduler/action.h"
#include "scheduler/placement.h"
#include "transport/tcp/tcp_channel.h"
#include "transport/tcp/tcp_header_link.h"
#include "worker/background_task.h"
#include "worker/device_backends.h"
#include "worker/drain_gate.h"
#include "worker/stage_executor.h"

namespace conveyor::worker {

// Used when a program's recv_timeout_ms is 0.
inline constexpr std::chrono::milliseconds kDefaultRecvTimeout{30000};

// One checkpoint write of this rank's stages.
struct CheckpointWrite {
  int64_t step = 0;
  absl::Status status;  // OK: every file below is durable at its name.
  // From the snapshot's start to the last file durable.
  double seconds = 0;
  std::vector<v1::StageFile> files;  // One per stage of the rank, on success.
  // How long the step loop waited for the previous write to finish before
  // this one could start (at most one is in flight), and how long it stood
  // still copying the stages to host memory: the write's whole cost to the
  // step loop.
  double wait_seconds = 0;
  double snapshot_seconds = 0;
};

struct JobRunnerOptions {
  // Where the job's data plane listens: "host:port", port 0 for a free one.
  // The host is what peers are told (data_endpoint()), except a wildcard
  // (0.0.0.0, ::), which is replaced by this machine's host name.
  std::string listen_address = "127.0.0.1:0";
  // How long Start keeps dialing peers that are not listening yet.
  std::chrono::milliseconds connect_timeout{10000};
  // The cluster's shared token (common/auth_token.h); empty: none. Keys the
  // data plane's handshake (DataPlaneSecret), so ranks with different tokens
  // cannot connect; the token itself never leaves this process.
  std::string auth_token;
  // The device the job computes on (worker/device_backends.h), for the
  // job's training.precision; nullptr: the CPU. Outlives the runner.
  DeviceBackends* backends = nullptr;
  // Told about the data plane's traffic and failures; outlives the runner.
  transport::DataPlaneObserver* observer = nullptr;
  // After each checkpoint write, on the thread that wrote it (not the job
  // thread): see CheckpointWrite.
  std::function<void(const CheckpointWrite&)> on_checkpoint = nullptr;
  // Fault injection for tests of a worker killed mid-checkpoint: sleep this
  // long before writing each stage file. Never set in production.
  std::chrono::milliseconds TEST_checkpoint_delay{0};
  // Fault injection for tests of a rank that fails mid-step: run each step
  // without its last this many actions (the program itself must match the
  // plan). Never set in production.
  int TEST_drop_last_actions = 0;
  // Check after every step that each tied parameter's copies are bitwise
  // equal (ExecutorConfig::check_tied); unset: in debug builds only.
  std::optional<bool> check_tied = std::nullopt;
  // The worker's --peak-tflops, per device, in FLOP/s; 0: ask the backend.
  double peak_flops_per_device = 0;
  // The job file as this worker parsed it to profile the job, if it did:
  // Create plans from it rather than parsing the program's YAML again
  // (job::PlanOfProgram).
  std::shared_ptr<const job::ParsedJob> parsed = nullptr;
};

// What one finished step reports; the session turns it into a StepReport.
struct StepProgress {
  int64_t step = 0;  // 1-based.
  double seconds = 0;
  double wait_seconds = 0;
  bool has_loss = false;  // This rank holds the last stage.
  double loss = 0;
  double learning_rate = 0;  // The rate the optimizer used for the step.
  uint64_t peak_activation_bytes = 0;
  // The executor's whole result (timeline, per-stage times); always set,
  // valid during the on_step call only.
  const RankStepResult* result = nullptr;
  // The evaluation after this step (the job's eval section), when one was
  // due; valid during the on_step call only.
  const RankEvalResult* eval = nullptr;
};

// The ranks `rank` exchanges tensors with, for the NCCL channel's peer list
// (symmetric, as its rounds need), ascending: the holders of the stages next
// to its own under `placement` (with loop placement and virtual stages the
// ends are neighbours, since stage P-1 feeds stage P on rank 0), and the
// holder of the other side of each tied parameter it holds. Leaving every
// other edge out keeps unrelated ranks' rounds from waiting on each other.
std::vector<int> PipelinePeers(scheduler::Placement placement, int rank,
                               int num_ranks, int num_stages,
                               const std::vector<engine::TiedParameter>& tied);

// "rank 1 (stages 1, 3)" for `program`, to prefix failure messages with.
std::string DescribeRank(const v1::JobProgram& program);

class JobRunner {
 public:
  // Builds this rank's part of `program` (see the file comment).
  //   InvalidArgument: the YAML does not parse, or the program is
  //     inconsistent (rank, stage counts, actions, secret);
  //   FailedPrecondition: "program/build mismatch ...": this build arrives
  //     at other stages, layers or parameter names than the coordinator's;
  //   NotFound/PermissionDenied/...: init.from or data files, or the
  //     checkpoint directory cannot be created, or a resume file is missing;
  //   DataLoss: a resume file's size or CRC-32C differs from the program's;
  //   Unavailable: the data address cannot be bound;
  //   Internal: libcrypto cannot derive the data-plane secret.
  static absl::StatusOr<std::unique_ptr<JobRunner>> Create(
      const v1::JobProgram& program, const JobRunnerOptions& options);

  // Closes the channel (flushing queued sends to peers, bounded).
  ~JobRunner();

  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  const std::string& job_id() const { return program_.job_id(); }
  int rank() const { return program_.rank(); }
  // "host:port" the job's channel listens on, for JobReady.
  const std::string& data_endpoint() const { return data_endpoint_; }
  // Steps completed so far.
  int64_t steps_done() const { return steps_done_.load(); }

  // For JobReady: the GPU's UUID ("" on the CPU) and whether this rank can
  // put its tensors on NCCL.
  const std::string& device_uuid() const { return device_uuid_; }
  bool nccl() const { return nccl_; }
  // For JobReady: the summed peak FLOP/s of the devices this rank computes
  // on (JobRunnerOptions::peak_flops_per_device, else the backends'); 0
  // when unknown.
  double peak_flops() const { return peak_flops_; }

  // Connects to the other ranks; peers[r] is rank r's data endpoint. With
  // `nccl` (the coordinator's choice, StartJob) the ranks then join the
  // job's NCCL communicator, whose id rank 0 creates now and sends to every
  // rank over the TCP connections, and tensors travel over NCCL, announced
  // over those connections (TcpHeaderLink). Returns the cancel status if
  // Cancel came first, else the channel's Connect errors (InvalidArgument,
  // PermissionDenied, FailedPrecondition, DeadlineExceeded) or NCCL's
  // (DeadlineExceeded when a rank never joined within the connect
  // timeout); the channels are aborted on failure. A Cancel while joining
  // NCCL takes effect once the join ends (bounded by the connect timeout).
  absl::Status Start(const std::vector<std::string>& peers, bool nccl = false);

  // Runs the remaining steps, calling on_step (on this thread) after each,
  // then writes the checkpoint if the program has a directory. Returns the
  // cancel status after Cancel, or the first step or write error (the
  // channel is then aborted with it). Call after a successful Start.
  absl::Status Run(const std::function<void(const StepProgress&)>& on_step);

  // Stops the job with `status` (not OK): aborts the channel, so a blocked
  // Recv or Connect returns now, and Run stops before its next step. The
  // first call wins; later ones are ignored.
  void Cancel(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // Drain (worker/drain_gate.h), from any thread: the step whose end is
  // this rank's next boundary, where Run waits until StopAfter; then Run
  // writes that step's checkpoint (whatever checkpoint.every says) and
  // returns OK after it, drained_after_step() saying so.
  int64_t RequestStop() { return drain_.RequestStop(); }
  void StopAfter(int64_t step) { drain_.StopAfter(step); }
  // The step Run stopped after for a drain; 0: it ran to the end.
  int64_t drained_after_step() const { return drain_.stopped_after(); }

  // The parameters of this rank's stages, in stage then build order.
  std::vector<engine::Parameter*> parameters() const;

 private:
  JobRunner(v1::JobProgram program, job::JobSpec job,
            std::vector<scheduler::Action> actions, engine::Backend* backend,
            DeviceBackends* backends)
      : program_(std::move(program)),
        job_(std::move(job)),
        backend_(backend),
        backends_(backends),
        actions_(std::move(actions)) {}

  // ResourceExhausted, naming the sizes and what to change, when this rank's
  // parameters with their gradients and optimizer state cannot fit in the
  // host memory left (CPU backends only).
  absl::Status CheckParametersFitHostMemory() const;
  // ResourceExhausted when a lower bound of the activations this rank holds
  // at its schedule's peak (every layer output of each microbatch between
  // its forward and its backward; the stage input only under remat) does
  // not fit in the host memory left once the parameters are in.
  absl::Status CheckActivationsFitHostMemory() const;
  absl::Status Build(const JobRunnerOptions& options);
  // The executor, moving tensors through `channel`.
  absl::Status CreateExecutor(transport::Channel* channel);
  // Hands out the NCCL id (rank 0) or waits for it, then joins the job's
  // NCCL communicator (Start).
  absl::Status JoinNccl();
  // Aborts the NCCL channel, if any, then the TCP one.
  void AbortChannels(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RunSteps(
      const std::function<void(const StepProgress&)>& on_step);
  // Sums `value` over all ranks through the channel (see job_runner.cc).
  absl::StatusOr<double> AllReduceSum(int64_t step, double value);
  // One stage's checkpoint in host memory: its file's metadata and tensors
  // (pointing into `host`, whose vectors are never resized while a write is
  // in flight).
  struct StageSnapshot {
    checkpoint::StageFileInfo info;
    std::vector<std::vector<float>> host;
    std::vector<engine::TensorToWrite> tensors;
  };
  // Waits for the previous checkpoint write, snapshots this rank's stages
  // for `step` and starts writing them in the background, reporting to
  // on_checkpoint when done. Returns the previous write's error, or the
  // snapshot's.
  absl::Status WriteCheckpoint(int64_t step);
  // Copies the stages into snapshot_ (no write may be in flight).
  absl::Status SnapshotStages(int64_t step);
  // Writes the files of `snapshot` (on the writer's thread).
  absl::StatusOr<std::vector<v1::StageFile>> WriteSnapshot(
      int64_t step, const std::vector<StageSnapshot>& snapshot);
  // Loads the parameters and optimizer state of program.resume_step.
  absl::Status LoadResumeFiles();
  // The step's memory peaks of the fullest of this rank's devices (by
  // reserved bytes), then starts each device's next peak.
  engine::MemoryStats TakeStepMemory();
  // The cancel status if Cancel was called, else `status`; aborts the
  // channel with the result when it is an error.
  absl::Status Fail(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  const v1::JobProgram program_;
  job::JobSpec job_;
  engine::Backend* const backend_;
  DeviceBackends* const backends_;  // Null: the CPU.
  std::chrono::milliseconds recv_timeout_{kDefaultRecvTimeout};
  std::chrono::milliseconds connect_timeout_{10000};
  std::string device_uuid_;
  double peak_flops_ = 0;
  bool nccl_ = false;
  std::function<void(const CheckpointWrite&)> on_checkpoint_;
  // The data-plane metrics, for the NCCL channel made at Start.
  transport::DataPlaneObserver* observer_ = nullptr;
  std::chrono::milliseconds TEST_checkpoint_delay_{0};
  bool check_tied_ = kDebugBuild;

  // With pipeline.devices_per_stage > 1: moves tensors between the devices
  // the stages are replicated on. Outlives the stages.
  std::unique_ptr<engine::MeshCollective> mesh_;
  // The CPU kernels' thread count before a tensor-parallel job lowered it
  // to one device's share (Build); 0 when untouched.
  int cpu_threads_before_ = 0;
  // Stages (MeshStages on a mesh), ascending index.
  std::vector<std::unique_ptr<engine::PipelineStage>> stages_;
  std::unique_ptr<engine::DataSource> data_;
  std::unique_ptr<engine::DataSource> eval_data_;  // With an eval section.
  std::unique_ptr<engine::Optimizer> optimizer_;
  std::vector<scheduler::Action> actions_;
  // One evaluation's forward-only actions (the plan's eval schedule).
  std::vector<scheduler::Action> eval_actions_;
  // Where the schedule puts each stage (set by Create).
  scheduler::Placement placement_ = scheduler::Placement::kLoop;
  // Destroyed in reverse: the executor before the channel it uses, the
  // NCCL channel before the header link it announces over, the link before
  // the TCP channel carrying it.
  std::unique_ptr<transport::TcpChannel> channel_;
  std::unique_ptr<transport::TcpHeaderLink> header_link_;
  // Set by Start when the job is on NCCL; read by Cancel.
  std::unique_ptr<transport::Channel> nccl_channel_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<StageExecutor> executor_;
  std::string data_endpoint_;

  std::atomic<int64_t> steps_done_{0};
  DrainGate drain_;
  Cancellation cancellation_;  // Installed on the job thread during Run.
  mutable absl::Mutex mu_;
  // The newest checkpoint's snapshot, one per stage: written by the job
  // thread before a write starts, read by the writer until it is waited for.
  std::vector<StageSnapshot> snapshot_;
  // Last, so destroyed first: the write in flight uses the members above.
  BackgroundTask checkpoint_writer_;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_JOB_RUNNER_H_
