#include "cli/run_command.h"

#include <csignal>
#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/directory.h"
#include "checkpoint/resume.h"
#include "cli/coordinator_client.h"
#include "cli/core_shares.h"
#include "cli/exit_status.h"
#include "cli/format.h"
#include "cli/interrupt_handler.h"
#include "cli/job_commands.h"
#include "cli/job_file.h"
#include "cli/local_cluster.h"
#include "cli/trace_render.h"
#include "cli/watch.h"
#include "common/cpu_set.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "job/job_spec.h"
#include "job/planner.h"
#include "job/trainer.h"

namespace conveyor::cli {
namespace {

// Unary calls to our own coordinator on localhost: generous, since a
// loaded machine (CI) can be slow to schedule a fresh daemon.
constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
// How long a cancelled job gets to end (workers stop at a step boundary)
// before run stops waiting for it.
constexpr absl::Duration kCancelGrace = absl::Seconds(5);

// The job file with --set, and --steps with what it needs (StepsOverrides),
// noted on `out`.
absl::StatusOr<JobSource> ReadRunSource(const RunCommandOptions& o,
                                        std::ostream& out) {
  std::string note;
  absl::StatusOr<JobSource> source =
      ReadJobSource(o.job_file, o.overrides, o.steps, &note);
  out << note;
  return source;
}

// --overwrite: the checkpoints an earlier run left in checkpoint.dir go
// before this run starts, instead of refusing the job over them (a demo or a
// smoke test run twice). Only step-<N> directories are removed: what the
// refusal is about, and what this project wrote.
absl::Status RemoveEarlierRun(const RunCommandOptions& o,
                              const job::JobSpec& job, std::ostream& out) {
  if (!o.overwrite || job.checkpoint.dir.empty()) return absl::OkStatus();
  if (job.resume.kind != job::ResumeSpec::Kind::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        "run: --overwrite starts from scratch, and the job resumes (resume at ",
        job.resume.where.ToString(), "): drop one of them"));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> removed,
                   checkpoint::RemoveAllCheckpoints(job.checkpoint.dir));
  if (!removed.empty()) {
    out << "--overwrite: removed " << removed.size()
        << " checkpoint step(s) of an earlier run from "
        << std::filesystem::path(job.checkpoint.dir).lexically_normal().string()
        << " (steps " << removed.front() << " to " << removed.back() << ")\n";
  }
  return absl::OkStatus();
}

absl::Status RunInProcess(const RunCommandOptions& o, bool tty,
                          std::ostream& out) {
  ASSIGN_OR_RETURN(const JobSource source, ReadRunSource(o, out));
  ASSIGN_OR_RETURN(const job::ParsedJob parsed, ParseJobSource(source));
  const job::JobSpec& job = parsed.spec;
  RETURN_IF_ERROR(RemoveEarlierRun(o, job, out));
  engine::Backend* backend = engine::CpuBackend::Get(job.training.precision);
  // Create the checkpoint directory first: a run that cannot write its
  // result should fail before training, not after.
  if (!job.checkpoint.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(job.checkpoint.dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create checkpoint.dir ", job.checkpoint.dir,
                       ": ", ec.message()));
    }
    if (job.checkpoint.every > 0 || job.checkpoint.keep_latest > 0) {
      out << "note: checkpoint.every and keep_latest are not used by "
             "--in-process; only the final parameters are written\n";
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<job::InProcessTrainer> trainer,
                   job::InProcessTrainer::Create(backend, job));
  out << absl::StrFormat(
      "job %s: %d layers in %d stage(s), %d parameters; %d steps of batch %d "
      "in %d microbatches, in process on %s\n",
      job.name, job.model.layers.size(), job.model.num_stages,
      job.model.NumParams(), job.training.steps, job.training.batch_size,
      job.training.microbatches, backend->Name());
  out.flush();
  // The same lines and progress bar a pipelined run prints, so the two
  // compare at a glance.
  v1::Job shown;
  shown.set_steps_total(job.training.steps);
  double tokens_per_sample = 0;
  if (job.model.token_input) {
    tokens_per_sample = 1;
    for (int64_t d : job.model.input_shape) tokens_per_sample *= d;
  }
  const double flops_per_sample = job.model.TrainingFlopsPerSample();
  WatchPrinter printer(out, {.log_every = o.log_every, .tty = tty});
  absl::Status trained = trainer->Run([&](const job::StepReport& r) {
    v1::StepSummary step;
    step.set_step(r.step);
    step.set_has_loss(true);
    step.set_loss(r.loss);
    step.set_seconds(r.seconds);
    step.set_samples_per_second(r.samples_per_second);
    step.set_tokens_per_second(r.samples_per_second * tokens_per_sample);
    step.set_learning_rate(r.learning_rate);
    step.set_grad_norm(r.grad_norm);
    step.set_tflops_per_device(r.samples_per_second * flops_per_sample / 1e12);
    step.set_peak_memory_allocated_bytes(r.memory.peak_allocated);
    step.set_peak_memory_reserved_bytes(r.memory.peak_reserved);
    step.set_memory_capacity_bytes(r.memory.capacity);
    if (r.eval.has_value()) {
      step.set_has_eval(true);
      step.set_eval_loss(r.eval->loss);
      step.set_eval_perplexity(r.eval->perplexity.value_or(0));
      step.set_eval_seconds(r.eval->seconds);
    }
    printer.OnStep(shown, step);
  });
  printer.EndBar();
  RETURN_IF_ERROR(trained);
  if (!job.checkpoint.dir.empty()) {
    const std::string path =
        (std::filesystem::path(job.checkpoint.dir) / "params.safetensors")
            .string();
    RETURN_IF_ERROR(trainer->SaveParameters(path));
    out << "final parameters: " << path << "\n";
  }
  return absl::OkStatus();
}

absl::Status Interrupted(int signal, std::ostream& err) {
  err << "conveyorctl: interrupted by "
      << (signal == SIGINT ? "SIGINT" : "SIGTERM")
      << "; the local cluster is stopped\n";
  return AlreadyReported(absl::StatusCode::kCancelled, "interrupted",
                         128 + signal);
}

std::string LogsLine(const LocalCluster& cluster) {
  return absl::StrCat("the daemons' logs: ",
                      absl::StrJoin(cluster.LogPaths(), " "));
}

void PrintLogs(const LocalCluster& cluster, std::ostream& err) {
  err << "conveyorctl: " << LogsLine(cluster) << "\n";
}

// The last step's bubble, split as `conveyorctl trace --output` splits it
// (cli/trace_render.h): what the stage cut's imbalance explains and what
// comes on top. A summary only, so nothing when there is nothing to split
// (one stage) or the coordinator keeps no timeline.
void PrintLastBubble(CoordinatorClient& client, const std::string& id,
                     std::ostream& out) {
  absl::StatusOr<v1::Trace> trace = client.GetTrace(id, 0);
  if (!trace.ok() || trace->num_ranks() < 2) return;
  absl::StatusOr<BubbleBreakdown> bubble = ExplainBubble(*trace);
  if (bubble.ok()) out << "last step's " << FormatBubbleBreakdown(*bubble);
}

// What the coordinator checks of a job's checkpoints at submission (an
// earlier run's steps it would write over, a resume point that is not
// there), checked before any daemon starts: a refused job then costs no
// process and leaves no log folder.
absl::Status CheckCheckpointsFirst(const job::ParsedJob& parsed) {
  const job::JobSpec& job = parsed.spec;
  if (job.checkpoint.dir.empty()) return absl::OkStatus();
  int64_t from = 0;
  if (job.resume.kind != job::ResumeSpec::Kind::kNone) {
    ASSIGN_OR_RETURN(const checkpoint::ResumePoint point,
                     checkpoint::FindResumePoint(
                         job.resume, job.checkpoint.dir, parsed.config_hash,
                         parsed.training_hash, parsed.yaml));
    from = point.step;
  }
  RETURN_IF_ERROR(checkpoint::CheckNothingNewer(job.checkpoint.dir, from));
  return checkpoint::CheckCheckpointDirWritable(job.checkpoint.dir);
}

absl::Status RunOnLocalCluster(const RunCommandOptions& o, bool tty,
                               std::ostream& out, std::ostream& err) {
  // Everything that can be checked without daemons is, so a bad job or a
  // missing binary costs no process.
  ASSIGN_OR_RETURN(const JobSource source, ReadRunSource(o, out));
  ASSIGN_OR_RETURN(const job::ParsedJob parsed, ParseJobSource(source));
  ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJob(parsed.spec));
  const int num_workers = o.workers > 0 ? o.workers : plan.num_ranks;
  if (num_workers < plan.num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers ", num_workers, ": the job's pipeline needs ",
                     plan.num_ranks, " workers"));
  }
  const BinarySearch search = BinarySearch::FromEnvironment();
  LocalClusterOptions options;
  options.num_workers = num_workers;
  options.worker_devices = o.devices;
  if (o.devices.size() > 1 &&
      static_cast<int>(o.devices.size()) != num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "run: --devices given ", o.devices.size(), " times for ", num_workers,
        " workers; give it once (every worker gets it) or once per worker"));
  }
  // A job whose stages run data parallel needs workers with that many
  // devices: by default a CPU mesh (the devices share the CPU; the split
  // and the gradient sums are the same as on GPUs).
  const int64_t devices = plan.job.pipeline.devices_per_stage;
  std::vector<int> cores;
  if (absl::StatusOr<std::vector<int>> allowed = AllowedCpus(); allowed.ok()) {
    cores = *std::move(allowed);
  }
  const CoreShares shares =
      PlanCoreShares({.cores = cores,
                      .workers = num_workers,
                      .devices_per_stage = static_cast<int>(devices),
                      .devices = o.devices,
                      .pin = !o.no_pin});
  if (!shares.worker_devices.empty()) {
    options.worker_devices = shares.worker_devices;
  }
  options.worker_cpu_cores = shares.worker_cpu_cores;
  const std::string& cores_note = shares.description;
  for (const std::string& d : o.devices) {
    const int64_t given = static_cast<int64_t>(
        std::vector<std::string>(absl::StrSplit(d, ',')).size());
    if (given < devices) {
      return absl::InvalidArgumentError(
          absl::StrCat("run: --devices ", d, " gives a worker ", given,
                       " device(s); the job's pipeline.devices_per_stage (",
                       plan.job.pipeline.devices_per_stage_where.ToString(),
                       ") needs ", devices));
    }
  }
  ASSIGN_OR_RETURN(options.coordinator_binary,
                   FindDaemonBinary(kCoordinatorBinary, search));
  ASSIGN_OR_RETURN(options.worker_binary,
                   FindDaemonBinary(kWorkerBinary, search));
  RETURN_IF_ERROR(RemoveEarlierRun(o, plan.job, out));
  RETURN_IF_ERROR(CheckCheckpointsFirst(parsed));

  // From here on a signal cancels and tears down rather than kills.
  ASSIGN_OR_RETURN(std::unique_ptr<InterruptHandler> interrupts,
                   InterruptHandler::Install(kCancelGrace, err));
  options.interrupted = [&interrupts] { return interrupts->signal() != 0; };

  const std::string plan_text = job::DescribePlan(plan);
  out << plan_text.substr(0, plan_text.find('\n')) << "\n";
  out << "starting a local cluster: " << kCoordinatorBinary << " and "
      << num_workers << " " << kWorkerBinary << "(s), " << cores_note << "\n";
  out.flush();
  absl::StatusOr<std::unique_ptr<LocalCluster>> started =
      LocalCluster::Start(std::move(options));
  if (!started.ok()) {
    if (interrupts->signal() != 0) {
      return Interrupted(interrupts->signal(), err);
    }
    return started.status();
  }
  std::unique_ptr<LocalCluster> cluster = *std::move(started);
  ASSIGN_OR_RETURN(
      std::unique_ptr<CoordinatorClient> client,
      CoordinatorClient::Create(cluster->coordinator_address(), kRpcTimeout));

  // The result of the part that needs the client, which must be untracked
  // before it goes away.
  std::optional<v1::Job> final_job;
  absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(cluster->WaitForWorkers(*client));
    out << "local cluster: coordinator at " << cluster->coordinator_address()
        << ", " << num_workers << " worker(s) idle; logs in "
        << cluster->log_dir() << "\n";
    out.flush();
    ASSIGN_OR_RETURN(v1::Job submitted,
                     client->SubmitJob(MakeSubmitRequest(source)));
    // The watch's first line shows the job's id and state.
    interrupts->Track(client.get(), submitted.id());
    ASSIGN_OR_RETURN(final_job,
                     WatchToEnd(*client, submitted.id(),
                                {.log_every = o.log_every, .tty = tty}, out));
    if (final_job->state() == v1::SUCCEEDED) {
      PrintLastBubble(*client, submitted.id(), out);
    }
    return absl::OkStatus();
  }();
  interrupts->Untrack();
  // A daemon that died explains a broken watch better than the watch does.
  const absl::Status daemons = cluster->CheckDaemons();
  cluster->Stop();
  const int signal = interrupts->signal();
  interrupts.reset();  // Restores the previous dispositions.

  if (signal != 0) {
    // A job that ended as asked leaves nothing worth reading.
    if (final_job.has_value() && final_job->state() == v1::CANCELLED) {
      cluster->RemoveLogs();
    } else {
      PrintLogs(*cluster, err);
    }
    return Interrupted(signal, err);
  }
  if (!status.ok()) {
    std::string message(status.message());
    if (!daemons.ok() && !absl::StrContains(message, daemons.message())) {
      absl::StrAppend(&message, "\n", daemons.message());
    }
    absl::StrAppend(&message, "\n", LogsLine(*cluster));
    return absl::Status(status.code(), message);
  }
  absl::Status outcome = JobOutcomeStatus(*final_job);
  if (outcome.ok() && !o.keep_logs) {
    cluster->RemoveLogs();
  } else {
    PrintLogs(*cluster, err);
  }
  return outcome;
}

}  // namespace

CLI::App* AddRunCommand(CLI::App& app, RunCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Train a job on an embedded local cluster (a coordinator and worker "
      "daemons started for this run), or with --in-process in this process: "
      "the numerical reference for pipelined runs");
  cmd->add_option("job", o.job_file, "Job YAML file")->required();
  cmd->add_flag("--keep-logs", o.keep_logs,
                "Keep the daemons' logs after a job that succeeds too, and "
                "print where (they are always kept when it does not)");
  cmd->add_option("-w,--workers", o.workers,
                  "Worker daemons to start (default: as many as the job's "
                  "pipeline needs)");
  cmd->add_option("--devices", o.devices,
                  "The workers' devices: once for all (cuda:0: they share "
                  "GPU 0; cuda:0,1: each owns a mesh of GPUs 0 and 1, see "
                  "pipeline.devices_per_stage) or once per worker (cuda:0 "
                  "then cuda:1: tensors go over NCCL); default: the CPU, "
                  "each worker cpu:N with N its share of the cores this "
                  "process may use, a CPU mesh for devices_per_stage > 1");
  cmd->add_flag("--no-pin", o.no_pin,
                "Do not pin local CPU workers to their share of the cores "
                "(--cpu-cores); they still get that many threads");
  cmd->add_option("--set", o.overrides,
                  "Override a value: key.path=value (the value is YAML; "
                  "repeatable)");
  cmd->add_option("--steps", o.steps,
                  "Override training.steps (0: as in the job)");
  cmd->add_option("--log-every", o.log_every,
                  "Without a terminal, print every N-th step (default: about "
                  "20 lines over the job)");
  cmd->add_flag("--overwrite", o.overwrite,
                "Start from scratch: remove the checkpoint steps an earlier "
                "run left in checkpoint.dir (instead of refusing the job)");
  cmd->add_flag("--in-process", o.in_process,
                "Train in this process with the reference trainer (no "
                "daemons)");
  return cmd;
}

absl::Status RunRunCommand(const RunCommandOptions& o, bool tty,
                           std::ostream& out, std::ostream& err) {
  if (o.steps < 0 || o.log_every < 0 || o.workers < 0) {
    return absl::InvalidArgumentError(
        "run: --steps, --log-every and --workers must be >= 0");
  }
  if (o.in_process) {
    if (o.workers > 0 || !o.devices.empty() || o.no_pin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "run: ",
          o.workers > 0 ? "--workers" : (o.no_pin ? "--no-pin" : "--devices"),
          " is for the daemons; it does not go with "
          "--in-process"));
    }
    return RunInProcess(o, tty, out);
  }
  return RunOnLocalCluster(o, tty, out, err);
}

}  // namespace conveyor::cli
