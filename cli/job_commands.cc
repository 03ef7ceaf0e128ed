#include "cli/job_commands.h"

#include <iostream>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/format.h"
#include "cli/json_output.h"
#include "cli/trace_render.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "proto/protocol.h"

namespace conveyor::cli {
namespace {

void AddOutputFormat(CLI::App* cmd, JobCommandOptions& o) {
  cmd->add_option("-o,--output", o.output_format,
                  "table, or json: the coordinator's messages in the proto3 "
                  "JSON mapping (docs/cli-json.md)")
      ->check(CLI::IsMember({kTableFormat, kJsonFormat}))
      ->capture_default_str();
}

void AddLogEvery(CLI::App* cmd, JobCommandOptions& o) {
  cmd->add_option("--log-every", o.log_every,
                  "Without a terminal, print every N-th step (default: about "
                  "20 lines over the job)");
}

std::string StateText(const v1::Job& job) {
  std::string out =
      absl::StrCat(job.id(), " ", proto::JobStateName(job.state()));
  if (!job.message().empty()) absl::StrAppend(&out, ": ", job.message());
  return out;
}

}  // namespace

bool JobCommands::AnyParsed() const {
  for (const CLI::App* cmd :
       {submit, status, watch, cancel, jobs, workers, trace, drain}) {
    if (cmd != nullptr && cmd->parsed()) return true;
  }
  return false;
}

JobCommands AddJobCommands(CLI::App& app, JobCommandOptions& o) {
  JobCommands c;
  c.submit = app.add_subcommand(
      "submit",
      "Send a job to the coordinator, which validates, queues and runs it; "
      "prints the job's id and state");
  c.submit->add_option("job", o.job_file, "Job YAML file")->required();
  c.submit->add_option("--set", o.overrides,
                       "Override a value: key.path=value (the value is YAML; "
                       "repeatable)");
  c.submit
      ->add_option("--steps", o.steps,
                   "Override training.steps, as `run --steps` does (0: as "
                   "in the job)")
      ->check(CLI::NonNegativeNumber);
  c.submit->add_flag("--watch", o.watch,
                     "Then follow the job to its end (exit 0 only if it "
                     "succeeds)");
  AddLogEvery(c.submit, o);

  c.status = app.add_subcommand("status", "Show one job in detail");
  c.status->add_option("job", o.job_id, "Job id (job-7)")->required();

  c.watch = app.add_subcommand(
      "watch",
      "Follow a job's progress until it ends; exit 0 only if it succeeds");
  c.watch->add_option("job", o.job_id, "Job id (job-7)")->required();
  AddLogEvery(c.watch, o);

  c.cancel = app.add_subcommand("cancel", "Cancel a job");
  c.cancel->add_option("job", o.job_id, "Job id (job-7)")->required();

  c.jobs = app.add_subcommand("jobs", "List the coordinator's jobs");
  c.workers = app.add_subcommand("workers", "List the registered workers");

  c.trace = app.add_subcommand(
      "trace",
      "Write one step's measured timeline: Chrome trace JSON (open it in "
      "https://ui.perfetto.dev) or an SVG drawn like `schedule --format svg`");
  c.trace->add_option("job", o.job_id, "Job id (job-7)")->required();
  c.trace
      ->add_option("--step", o.step,
                   "Step (1-based; default: the newest the coordinator "
                   "keeps)")
      ->check(CLI::NonNegativeNumber);
  c.trace->add_option("--format", o.format, "Output: json, svg")
      ->check(CLI::IsMember({"json", "svg"}))
      ->capture_default_str();
  c.trace->add_option("-o,--output", o.output,
                      "Write to this file and print a summary (default: the "
                      "trace to standard output)");
  c.drain = app.add_subcommand(
      "drain",
      "Move a worker's job to the other workers without losing a step (it "
      "checkpoints at its next step boundary and resumes there), then make "
      "the worker leave; what a worker's SIGTERM does too");
  c.drain->add_option("worker", o.worker, "Worker id (worker-3) or name")
      ->required();
  c.drain->add_option("--reason", o.reason,
                      "Why, recorded in the job's layouts and the logs");
  c.drain->add_flag("--no-wait", o.no_wait, "Return once the drain has begun");
  c.drain
      ->add_option("--wait-timeout", o.wait_timeout_seconds,
                   "Seconds to wait for the worker to leave (0: as long as "
                   "it takes)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  for (CLI::App* cmd :
       {c.submit, c.status, c.cancel, c.jobs, c.workers, c.drain}) {
    AddOutputFormat(cmd, o);
  }
  for (CLI::App* cmd : {c.submit, c.status, c.watch, c.cancel, c.jobs,
                        c.workers, c.trace, c.drain}) {
    AddCoordinatorFlags(cmd, o);
  }
  return c;
}

v1::SubmitJobRequest MakeSubmitRequest(const JobSource& source) {
  v1::SubmitJobRequest request;
  request.set_yaml(source.yaml);
  request.set_file_name(source.file_name);
  request.set_base_dir(source.base_dir);
  return request;
}

absl::Status RunSubmit(CoordinatorClient& client, const JobCommandOptions& o,
                       const WatchOptions& watch, std::ostream& out) {
  // The coordinator validates the job: parsing it here as well would only
  // risk a second opinion from a different build.
  if (o.json() && o.watch) {
    return absl::InvalidArgumentError(
        "submit: -o json prints the submitted job once; follow it with "
        "`conveyorctl watch` rather than --watch");
  }
  std::string note;
  ASSIGN_OR_RETURN(JobSource source,
                   ReadJobSource(o.job_file, o.overrides, o.steps, &note));
  // Not into a JSON document.
  (o.json() ? std::cerr : out) << note;
  ASSIGN_OR_RETURN(v1::Job job, client.SubmitJob(MakeSubmitRequest(source)));
  if (o.json()) return WriteProtoJson(job, out);
  out << job.id() << " " << proto::JobStateName(job.state()) << "\n";
  out.flush();
  if (!o.watch) return absl::OkStatus();
  return RunWatch(client, job.id(), watch, out);
}

absl::Status RunStatus(CoordinatorClient& client, const std::string& id,
                       absl::Time now, std::ostream& out, bool json) {
  ASSIGN_OR_RETURN(v1::Job job, client.GetJob(id));
  if (json) return WriteProtoJson(job, out);
  out << FormatJobDetails(job, now);
  return absl::OkStatus();
}

absl::Status RunWatch(CoordinatorClient& client, const std::string& id,
                      const WatchOptions& watch, std::ostream& out) {
  ASSIGN_OR_RETURN(v1::Job job, WatchToEnd(client, id, watch, out));
  return JobOutcomeStatus(job);
}

absl::Status RunTrace(CoordinatorClient& client, const JobCommandOptions& o,
                      std::ostream& out) {
  ASSIGN_OR_RETURN(v1::Trace trace, client.GetTrace(o.job_id, o.step));
  std::string text;
  if (o.format == "svg") {
    ASSIGN_OR_RETURN(text, RenderTraceSvg(trace));
  } else {
    text = RenderChromeTrace(trace);
  }
  if (o.output.empty() || o.output == "-") {
    out << text;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(WriteFileAtomically(o.output, text));
  out << "wrote " << o.output << ": " << trace.job_id() << " step "
      << trace.step() << ", " << trace.ranks_size() << " ranks ("
      << trace.schedule() << ")\n"
      << FormatAccounting(AccountTrace(trace));
  if (absl::StatusOr<BubbleBreakdown> bubble = ExplainBubble(trace);
      bubble.ok()) {
    out << FormatBubbleBreakdown(*bubble);
  } else {
    out << "no bubble breakdown: " << bubble.status().message() << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunCancel(CoordinatorClient& client, const std::string& id,
                       std::ostream& out, bool json) {
  ASSIGN_OR_RETURN(v1::Job job, client.CancelJob(id));
  if (json) return WriteProtoJson(job, out);
  out << StateText(job) << "\n";
  return absl::OkStatus();
}

absl::Status RunJobs(CoordinatorClient& client, absl::Time now,
                     std::ostream& out, bool json) {
  ASSIGN_OR_RETURN(v1::ListJobsResponse response, client.ListJobs());
  if (json) return WriteProtoJson(response, out);
  if (!response.warning().empty()) {
    out << "WARNING: " << response.warning() << "\n";
  }
  out << FormatJobsTable(
      std::vector<v1::Job>(response.jobs().begin(), response.jobs().end()),
      now);
  return absl::OkStatus();
}

absl::Status RunWorkers(CoordinatorClient& client, std::ostream& out,
                        bool json) {
  ASSIGN_OR_RETURN(std::vector<v1::Worker> workers, client.ListWorkers());
  if (json) {
    v1::ListWorkersResponse response;
    for (v1::Worker& w : workers) *response.add_workers() = std::move(w);
    return WriteProtoJson(response, out);
  }
  out << FormatWorkersTable(workers);
  return absl::OkStatus();
}

absl::Status RunDrain(CoordinatorClient& client, const JobCommandOptions& o,
                      std::ostream& out, absl::Duration poll) {
  ASSIGN_OR_RETURN(v1::Worker worker, client.DrainWorker(o.worker, o.reason));
  // -o json: the worker as the drain began, then the wait in silence.
  std::ostringstream silent;
  if (o.json()) RETURN_IF_ERROR(WriteProtoJson(worker, out));
  std::ostream& say = o.json() ? silent : out;
  const std::string who = absl::StrCat(worker.id(), " (", worker.name(), ")");
  if (worker.job_id().empty()) {
    say << "draining " << who << ": it holds no job, so it leaves now\n";
  } else {
    say << "draining " << who << ": " << worker.job_id()
        << " checkpoints at its next step boundary and moves to the other "
           "workers (a job without checkpoint.dir runs to its end first)\n";
  }
  out.flush();
  if (o.no_wait) return absl::OkStatus();
  const absl::Time deadline =
      o.wait_timeout_seconds > 0
          ? absl::Now() + absl::Seconds(o.wait_timeout_seconds)
          : absl::InfiniteFuture();
  while (true) {
    ASSIGN_OR_RETURN(std::vector<v1::Worker> workers, client.ListWorkers());
    const v1::Worker* found = nullptr;
    for (const v1::Worker& w : workers) {
      if (w.id() == worker.id()) found = &w;
    }
    if (found == nullptr || found->state() == v1::LOST) {
      say << who << " has left\n";
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          who, " is still draining after ", o.wait_timeout_seconds, " s",
          found->job_id().empty()
              ? ""
              : absl::StrCat(" (it holds ", found->job_id(), ")")));
    }
    absl::SleepFor(poll);
  }
}

absl::Status RunJobCommand(const JobCommands& c, const JobCommandOptions& o,
                           bool tty, std::ostream& out) {
  if (o.log_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log-every must be >= 1 (or 0 for the default); got ", o.log_every));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                   ConnectToCoordinator(o, std::cerr));
  const WatchOptions watch{.log_every = o.log_every, .tty = tty};
  if (c.submit->parsed()) return RunSubmit(*client, o, watch, out);
  if (c.status->parsed()) {
    return RunStatus(*client, o.job_id, absl::Now(), out, o.json());
  }
  if (c.watch->parsed()) return RunWatch(*client, o.job_id, watch, out);
  if (c.cancel->parsed()) return RunCancel(*client, o.job_id, out, o.json());
  if (c.jobs->parsed()) return RunJobs(*client, absl::Now(), out, o.json());
  if (c.workers->parsed()) return RunWorkers(*client, out, o.json());
  if (c.trace->parsed()) return RunTrace(*client, o, out);
  if (c.drain->parsed()) return RunDrain(*client, o, out);
  return absl::InternalError("no job command was parsed");
}

}  // namespace conveyor::cli
