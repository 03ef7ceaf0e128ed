#include "cli/format.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/host_memory.h"
#include "common/printable.h"
#include "job/job_policy.h"
#include "proto/protocol.h"

namespace conveyor::cli {
namespace {

// How much the newest step counts in the average: enough to follow a change
// of pace within ~10 steps, little enough that one slow step (a checkpoint)
// does not swing the estimate.
constexpr double kSmoothing = 0.2;

// "1 worker", "2 workers".
std::string Count(int64_t n, absl::string_view one, absl::string_view many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

std::string JobTitle(const v1::Job& job) {
  if (job.name().empty()) return job.id();
  // Escaped: a record from before names were checked may hold anything.
  return absl::StrCat(job.id(), " (", Printable(job.name()), ")");
}

std::string StepsText(int64_t done, int64_t total) {
  if (total <= 0) return absl::StrCat(done);
  return absl::StrCat(done, "/", total);
}

// Seconds between two Unix-millisecond times, when both are set.
std::optional<double> Between(int64_t from_ms, int64_t to_ms) {
  if (from_ms <= 0 || to_ms <= 0 || to_ms < from_ms) return std::nullopt;
  return static_cast<double>(to_ms - from_ms) / 1e3;
}

double SecondsSince(int64_t unix_ms, absl::Time now) {
  return absl::ToDoubleSeconds(now - absl::FromUnixMillis(unix_ms));
}

// "2 replica(s) x 2 tensor-parallel ranks": how a stage's mesh is split.
std::string TensorParallelText(const v1::Job& job) {
  const int t = job.tensor_parallel();
  return absl::StrCat(job.devices_per_stage() / t, " replica(s) x ", t,
                      " tensor-parallel ranks");
}

std::string PipelineText(const v1::Job& job) {
  std::string out = absl::StrFormat(
      "%s: %d worker(s) x %d virtual stage(s) = %d stage(s)",
      job.schedule().empty() ? "?" : job.schedule(), job.num_workers(),
      std::max(job.virtual_stages(), 1), job.num_stages());
  if (job.batch_size() > 0) {
    absl::StrAppendFormat(&out, "; batch %d in %d microbatch(es)",
                          job.batch_size(), job.microbatches());
  }
  return out;
}

std::string ThroughputText(double samples_per_second,
                           double tokens_per_second) {
  if (tokens_per_second > 0) {
    return absl::StrFormat("%.0f tokens/s", tokens_per_second);
  }
  return absl::StrFormat("%.0f samples/s", samples_per_second);
}

// "  eval loss 2.301234 (ppl 9.987)" for a step an evaluation followed;
// empty otherwise.
std::string EvalText(const v1::StepSummary& step) {
  if (!step.has_eval()) return "";
  std::string out = absl::StrFormat("  eval loss %.6f", step.eval_loss());
  if (step.eval_perplexity() > 0) {
    absl::StrAppendFormat(&out, " (ppl %.4g)", step.eval_perplexity());
  }
  return out;
}

}  // namespace

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  if (seconds < 10) return absl::StrFormat("%.1f s", seconds);
  if (seconds < 60) return absl::StrFormat("%.0f s", seconds);
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) widths[c] = header[c].size();
  for (const std::vector<std::string>& row : rows) {
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  std::string out;
  auto append_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < widths.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      line += cell;
      if (c + 1 < widths.size()) line.append(widths[c] - cell.size() + 2, ' ');
    }
    // Trailing empty cells would otherwise leave trailing spaces.
    line.erase(line.find_last_not_of(' ') + 1);
    out += line;
    out += '\n';
  };
  append_row(header);
  for (const std::vector<std::string>& row : rows) append_row(row);
  return out;
}

int64_t DefaultLogEvery(int64_t steps_total) {
  return std::max<int64_t>(1, (steps_total + 19) / 20);
}

bool ShouldLogStep(int64_t step, int64_t steps_total, int64_t log_every) {
  if (step == 1 || step == steps_total) return true;
  return log_every > 0 && step % log_every == 0;
}

void StepTimeEstimator::Add(double step_seconds) {
  if (!std::isfinite(step_seconds) || step_seconds < 0) return;
  average_ = average_.has_value()
                 ? kSmoothing * step_seconds + (1 - kSmoothing) * *average_
                 : step_seconds;
}

std::optional<double> StepTimeEstimator::Remaining(int64_t steps_done,
                                                   int64_t steps_total) const {
  if (!average_.has_value() || steps_total <= 0) return std::nullopt;
  return static_cast<double>(std::max<int64_t>(0, steps_total - steps_done)) *
         *average_;
}

namespace {

// "  mem 1.2 GiB (4%), 1.5 GiB reserved": the fullest device's peaks in
// the step (reserved shown when a caching allocator holds more than its
// tensors do), as TorchTitan and Megatron print them; "" when unknown.
std::string MemoryText(const v1::StepSummary& step) {
  if (step.peak_memory_reserved_bytes() == 0) return "";
  std::string out =
      absl::StrCat("  mem ", FormatBytes(step.peak_memory_allocated_bytes()));
  if (step.memory_capacity_bytes() > 0) {
    const double percent = 100.0 * step.peak_memory_allocated_bytes() /
                           step.memory_capacity_bytes();
    // A small model in a large RAM: "<1%", not a misleading "0%".
    absl::StrAppend(
        &out, percent < 1 ? " (<1%)" : absl::StrFormat(" (%.0f%%)", percent));
  }
  if (step.peak_memory_reserved_bytes() > step.peak_memory_allocated_bytes()) {
    absl::StrAppend(&out, ", ", FormatBytes(step.peak_memory_reserved_bytes()),
                    " reserved");
  }
  return out;
}

}  // namespace

std::string FormatStepLine(const v1::StepSummary& step, int64_t steps_total,
                           std::optional<double> eta_seconds) {
  std::string out;
  if (steps_total > 0) {
    // Pad the step to the total's width so the columns line up.
    const int width = static_cast<int>(absl::StrCat(steps_total).size());
    out = absl::StrFormat("step %*d/%d", width, step.step(), steps_total);
  } else {
    out = absl::StrFormat("step %d", step.step());
  }
  if (step.has_loss()) absl::StrAppendFormat(&out, "  loss %.6f", step.loss());
  absl::StrAppend(&out, EvalText(step));
  absl::StrAppendFormat(&out, "  lr %.3g  %.1f ms  %.0f samples/s",
                        step.learning_rate(), step.seconds() * 1e3,
                        step.samples_per_second());
  if (step.tokens_per_second() > 0) {
    absl::StrAppendFormat(&out, "  %.0f tokens/s", step.tokens_per_second());
  }
  if (step.grad_norm() > 0) {
    absl::StrAppendFormat(&out, "  grad norm %.3g", step.grad_norm());
  }
  if (step.tflops_per_device() > 0) {
    absl::StrAppendFormat(&out, "  %.3g TFLOP/s/device",
                          step.tflops_per_device());
  }
  if (step.mfu() > 0) {
    absl::StrAppendFormat(&out, "  MFU %.1f%%", step.mfu() * 100);
  }
  absl::StrAppend(&out, MemoryText(step));
  // The schedule bubble, as the trace SVG's title and
  // conveyor_job_bubble_ratio (docs/metrics.md).
  if (step.ranks_size() > 1) {
    absl::StrAppendFormat(&out, "  bubble %.1f%%",
                          step.bubble_fraction() * 100);
  }
  if (eta_seconds.has_value() && step.step() < steps_total) {
    absl::StrAppend(&out, "  ETA ", FormatDuration(*eta_seconds));
  }
  return out;
}

std::string FormatProgressBar(const v1::StepSummary& step, int64_t steps_total,
                              std::optional<double> eta_seconds, int width) {
  width = std::max(width, 1);
  int filled = 0;
  if (steps_total > 0) {
    const int64_t done = std::clamp<int64_t>(step.step(), 0, steps_total);
    filled = static_cast<int>(done * width / steps_total);
  }
  std::string out = absl::StrCat("[", std::string(filled, '#'),
                                 std::string(width - filled, '-'), "]");
  if (steps_total > 0) {
    const int digits = static_cast<int>(absl::StrCat(steps_total).size());
    absl::StrAppendFormat(&out, "  %*d/%d", digits, step.step(), steps_total);
  } else {
    absl::StrAppendFormat(&out, "  %d", step.step());
  }
  if (step.has_loss()) absl::StrAppendFormat(&out, "  loss %.6f", step.loss());
  absl::StrAppend(&out, EvalText(step));
  absl::StrAppend(
      &out, "  ",
      ThroughputText(step.samples_per_second(), step.tokens_per_second()));
  absl::StrAppendFormat(&out, "  %.1f ms/step", step.seconds() * 1e3);
  if (eta_seconds.has_value() && step.step() < steps_total) {
    absl::StrAppend(&out, "  ETA ", FormatDuration(*eta_seconds));
  }
  return out;
}

std::string FormatStateLine(const v1::Job& job) {
  std::string out =
      absl::StrCat(JobTitle(job), ": ", proto::JobStateName(job.state()));
  switch (job.state()) {
    case v1::QUEUED:
      if (job.queue_position() > 0) {
        absl::StrAppend(&out, ", position ", job.queue_position());
      }
      if (!job.queue_reason().empty()) {
        absl::StrAppend(&out, ": ", job.queue_reason());
      }
      break;
    case v1::PLANNING:
      // The workers load their stages and connect; RUNNING tells the rest.
      if (job.worker_ids_size() > 0) {
        absl::StrAppend(&out, " on ", absl::StrJoin(job.worker_ids(), ", "));
      }
      break;
    case v1::RUNNING:
      absl::StrAppend(&out, ": ", PipelineText(job));
      if (job.worker_ids_size() > 0) {
        absl::StrAppend(&out, " on ", absl::StrJoin(job.worker_ids(), ", "));
      }
      if (job.devices_per_stage() > 1) {
        absl::StrAppend(&out, ", ", job.devices_per_stage(),
                        " devices per stage");
        if (job.tensor_parallel() > 1) {
          absl::StrAppend(&out, " (", TensorParallelText(job), ")");
        }
      }
      if (!job.data_plane().empty()) {
        absl::StrAppend(&out, "; data plane: ", job.data_plane());
      }
      if (job.state() == v1::RUNNING && job.steps_done() > 0) {
        absl::StrAppend(&out, "; ",
                        StepsText(job.steps_done(), job.steps_total()),
                        " steps done");
      }
      break;
    default:
      if (!job.message().empty()) absl::StrAppend(&out, ": ", job.message());
      break;
  }
  // Once, with the first line a submission shows: what resuming from a
  // checkpoint of another configuration changes.
  if (job.state() == v1::QUEUED) {
    for (const std::string& note : job.resume_notes()) {
      absl::StrAppend(&out, "\n  note: ", note);
    }
  }
  return out;
}

std::string FormatOutcome(const v1::Job& job) {
  const std::string steps = StepsText(job.steps_done(), job.steps_total());
  switch (job.state()) {
    case v1::SUCCEEDED: {
      std::string out = absl::StrCat("SUCCEEDED: ", steps, " steps");
      if (std::optional<double> ran =
              Between(job.started_unix_ms(), job.ended_unix_ms())) {
        absl::StrAppend(&out, " in ", FormatDuration(*ran));
      }
      if (job.has_loss()) {
        absl::StrAppendFormat(&out, ", final loss %.6f", job.last_loss());
      }
      if (job.has_eval()) {
        absl::StrAppendFormat(&out, ", eval loss %.6f", job.last_eval_loss());
        if (job.last_eval_perplexity() > 0) {
          absl::StrAppendFormat(&out, " (perplexity %.4g)",
                                job.last_eval_perplexity());
        }
      }
      return out;
    }
    case v1::FAILED:
    case v1::CANCELLED:
      return absl::StrCat(
          proto::JobStateName(job.state()), ": ",
          job.message().empty() ? "(no reason given)" : job.message(),
          " (after ", steps, " steps)");
    default:
      return absl::StrCat(proto::JobStateName(job.state()), ": ", steps,
                          " steps");
  }
}

std::string FormatJobDetails(const v1::Job& job, absl::Time now) {
  std::vector<std::vector<std::string>> fields;
  if (!job.message().empty()) fields.push_back({"message", job.message()});
  std::string progress =
      absl::StrCat(StepsText(job.steps_done(), job.steps_total()), " steps");
  if (job.has_loss()) {
    absl::StrAppendFormat(&progress, ", loss %.6f", job.last_loss());
  }
  if (job.last_step_seconds() > 0) {
    absl::StrAppendFormat(&progress, ", %.1f ms/step, %.0f samples/s",
                          job.last_step_seconds() * 1e3,
                          job.samples_per_second());
    if (job.tokens_per_second() > 0) {
      absl::StrAppendFormat(&progress, ", %.0f tokens/s",
                            job.tokens_per_second());
    }
  }
  fields.push_back({"progress", progress});
  if (job.has_eval()) {
    std::string eval = absl::StrFormat("loss %.6f", job.last_eval_loss());
    if (job.last_eval_perplexity() > 0) {
      absl::StrAppendFormat(&eval, ", perplexity %.4g",
                            job.last_eval_perplexity());
    }
    absl::StrAppend(&eval, " after step ", job.last_eval_step());
    fields.push_back({"eval", eval});
  }
  fields.push_back({"pipeline", PipelineText(job)});
  if (job.state() == v1::QUEUED && job.queue_position() > 0) {
    fields.push_back(
        {"queue", absl::StrCat("position ", job.queue_position(),
                               job.queue_reason().empty() ? "" : "; ",
                               job.queue_reason())});
  }
  // Shown unless the default: normal, no owner, not aged.
  if (job.priority() != job::kPriorityNormal || !job.owner().empty() ||
      (job.state() == v1::QUEUED &&
       job.effective_priority() > job.priority())) {
    std::string priority = job::PriorityName(job.priority());
    if (job.state() == v1::QUEUED &&
        job.effective_priority() > job.priority()) {
      absl::StrAppend(&priority, " (", job.effective_priority(),
                      " with aging after ",
                      FormatDuration(job.queued_wait_ms() / 1e3), " queued)");
    }
    if (!job.owner().empty()) {
      absl::StrAppend(&priority, "; owner ", Printable(job.owner()));
    }
    fields.push_back({"priority", priority});
  }
  if (job.preemptions() > 0) {
    fields.push_back(
        {"preempted", absl::StrCat(job.preemptions(), " time",
                                   job.preemptions() == 1 ? "" : "s",
                                   ", last by ", job.preempted_by())});
  }
  if (job.created_unix_ms() > 0) {
    fields.push_back({"created", absl::StrCat(FormatDuration(SecondsSince(
                                                  job.created_unix_ms(), now)),
                                              " ago")});
  }
  if (job.started_unix_ms() > 0) {
    if (job.ended_unix_ms() > 0) {
      const double ran = static_cast<double>(std::max<int64_t>(
                             job.ended_unix_ms() - job.started_unix_ms(), 0)) /
                         1e3;
      fields.push_back(
          {"ran",
           absl::StrCat("for ", FormatDuration(ran), ", ended ",
                        FormatDuration(SecondsSince(job.ended_unix_ms(), now)),
                        " ago")});
    } else {
      fields.push_back(
          {"running", absl::StrCat("for ", FormatDuration(SecondsSince(
                                               job.started_unix_ms(), now)))});
    }
  }
  if (job.devices_per_stage() > 1 && job.tensor_parallel() > 1) {
    fields.push_back(
        {"devices", absl::StrCat(job.devices_per_stage(),
                                 " per stage: ", TensorParallelText(job))});
  } else if (job.devices_per_stage() > 1) {
    fields.push_back(
        {"devices",
         absl::StrCat(job.devices_per_stage(),
                      " per stage (each microbatch split over them)")});
  }
  if (!job.data_plane().empty()) {
    fields.push_back({"data plane", job.data_plane()});
  }
  if (!job.checkpoint_dir().empty()) {
    fields.push_back(
        {"checkpoint",
         job.last_checkpoint_step() > 0
             ? absl::StrCat(job.checkpoint_dir(), " (newest complete: step ",
                            job.last_checkpoint_step(), ")")
             : job.checkpoint_dir()});
  }
  if (job.resumed_from_step() > 0) {
    fields.push_back(
        {"resumed", absl::StrCat("from step ", job.resumed_from_step(), " (",
                                 job.resumed_from(), ")")});
    for (const std::string& note : job.resume_notes()) {
      fields.push_back({"", note});
    }
  }
  if (job.max_restarts() > 0) {
    std::string text =
        absl::StrCat(job.restarts(), " of at most ", job.max_restarts());
    if (!job.last_restart_reason().empty()) {
      absl::StrAppend(&text, "; last after: ", job.last_restart_reason());
    }
    fields.push_back({"restarts", text});
  }
  // Every layout, once there is more than one (an elastic restart).
  if (job.layouts_size() > 1) {
    for (int i = 0; i < job.layouts_size(); ++i) {
      const v1::JobLayout& l = job.layouts(i);
      std::string text =
          absl::StrCat("from step ", l.from_step(), ": ",
                       Count(l.num_workers(), "worker", "workers"), ", ",
                       Count(l.num_stages(), "stage", "stages"), " at layers [",
                       absl::StrJoin(l.stage_begin(), ", "), "]");
      if (!l.reason().empty()) absl::StrAppend(&text, "; ", l.reason());
      fields.push_back({i == 0 ? "layouts" : "", text});
    }
  }
  if (job.has_auto_split()) {
    const v1::AutoSplit& a = job.auto_split();
    // Predicted steps are often milliseconds.
    auto step = [](double seconds) {
      return seconds < 1 ? absl::StrFormat("%.2f ms", seconds * 1e3)
                         : FormatDuration(seconds);
    };
    if (!a.chosen()) {
      fields.push_back({"stages", "auto; not chosen yet (profiling)"});
    } else {
      std::string text = absl::StrFormat(
          "auto from a profile on %s%s; predicted step %s, bubble %.1f%%",
          a.profiled_on(), a.from_cache() ? " (cached)" : "",
          step(a.predicted_step_seconds()), a.predicted_bubble() * 100);
      if (a.predicted_even_step_seconds() > 0) {
        absl::StrAppend(&text, "; even split ",
                        step(a.predicted_even_step_seconds()));
      }
      fields.push_back({"stages", text});
    }
    if (a.schedule_auto()) {
      fields.push_back(
          {"schedule", a.chosen()
                           ? absl::StrCat("auto: chose ", a.schedule_choice())
                           : "auto; not chosen yet "
                             "(profiling)"});
    }
  }
  std::string out =
      absl::StrCat(JobTitle(job), ": ", proto::JobStateName(job.state()), "\n");
  size_t key_width = 0;
  for (const auto& f : fields) key_width = std::max(key_width, f[0].size());
  for (const auto& f : fields) {
    absl::StrAppend(&out, "  ", f[0], std::string(key_width - f[0].size(), ' '),
                    "  ", f[1], "\n");
  }
  if (job.stages_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    for (const v1::StagePlacement& s : job.stages()) {
      rows.push_back({absl::StrCat(s.stage()), absl::StrCat(s.rank()),
                      s.num_layers() > 0
                          ? absl::StrCat(s.first_layer(), "-",
                                         s.first_layer() + s.num_layers() - 1)
                          : "-",
                      absl::StrCat(s.num_params()),
                      s.worker_id().empty() ? "-" : s.worker_id()});
    }
    absl::StrAppend(
        &out, "\n",
        FormatTable({"STAGE", "RANK", "LAYERS", "PARAMETERS", "WORKER"}, rows));
  }
  return out;
}

std::string FormatJobsTable(const std::vector<v1::Job>& jobs, absl::Time now) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Job& job : jobs) {
    std::string schedule = job.schedule().empty() ? "-" : job.schedule();
    if (job.virtual_stages() > 1) {
      absl::StrAppend(&schedule, " V=", job.virtual_stages());
    }
    // The priority as the job file gave it; while queued, with the points
    // aging has added ("low+35": it ranks as 35 now).
    std::string priority = job::PriorityName(job.priority());
    const bool queued = job.state() == v1::QUEUED;
    if (queued && job.effective_priority() > job.priority()) {
      absl::StrAppend(&priority, "+",
                      job.effective_priority() - job.priority());
    }
    // Why a queued job waits; a preempted job says by whom until it runs
    // again.
    std::string why = "-";
    if (queued && !job.queue_reason().empty()) {
      why = Printable(job.queue_reason());
    }
    rows.push_back(
        {job.id(), job.name().empty() ? "-" : Printable(job.name()),
         std::string(proto::JobStateName(job.state())),
         StepsText(job.steps_done(), job.steps_total()),
         job.has_loss() ? absl::StrFormat("%.6f", job.last_loss()) : "-",
         schedule, absl::StrCat(job.num_workers()),
         job.created_unix_ms() > 0
             ? FormatDuration(SecondsSince(job.created_unix_ms(), now))
             : "-",
         priority, job.owner().empty() ? "-" : Printable(job.owner()), why});
  }
  return FormatTable({"ID", "NAME", "STATE", "STEPS", "LOSS", "SCHEDULE",
                      "WORKERS", "AGE", "PRIORITY", "OWNER", "WAITS FOR"},
                     rows);
}

namespace {

// The bound endpoint of the worker's job when it has one; else the
// configured address, whose port 0 means a free port per job.
std::string DataAddressText(const v1::Worker& w) {
  if (!w.data_endpoint().empty()) return w.data_endpoint();
  if (w.data_address().empty()) return "-";
  if (absl::EndsWith(w.data_address(), ":0")) {
    return absl::StrCat(w.data_address().substr(0, w.data_address().size() - 1),
                        "*");
  }
  return w.data_address();
}

}  // namespace

std::string FormatWorkersTable(const std::vector<v1::Worker>& workers) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Worker& w : workers) {
    rows.push_back(
        {w.id(), Printable(w.name()),
         absl::StrCat(proto::WorkerStateName(w.state()),
                      w.draining() && w.state() != v1::LOST ? " draining" : ""),
         w.job_id().empty() ? "-" : w.job_id(),
         w.stages_size() > 0 ? absl::StrJoin(w.stages(), ",") : "-",
         absl::StrCat(FormatDuration(w.seconds_since_heartbeat()), " ago"),
         DataAddressText(w),
         w.metrics_address().empty() ? "-" : w.metrics_address(),
         w.state() == v1::LOST ? w.lost_reason() : w.drain_reason()});
  }
  return FormatTable({"ID", "NAME", "STATE", "JOB", "STAGES", "HEARTBEAT",
                      "DATA-ADDRESS", "METRICS", "NOTE"},
                     rows);
}

}  // namespace conveyor::cli
