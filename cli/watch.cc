#include "cli/watch.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/exit_status.h"
#include "proto/protocol.h"

namespace conveyor::cli {

void WatchPrinter::OnEvent(const v1::JobEvent& event) {
  const v1::Job& job = event.job();
  if (!last_state_.has_value() || *last_state_ != job.state()) {
    last_state_ = job.state();
    if (!proto::IsTerminal(job.state())) {
      EndBar();
      out_ << FormatStateLine(job) << "\n";
    }
  }
  if (event.has_step()) OnStep(job, event.step());
  // Someone is watching: show each event as it comes, even through a pipe.
  out_.flush();
}

void WatchPrinter::OnStep(const v1::Job& job, const v1::StepSummary& step) {
  const absl::Time now = options_.clock ? options_.clock() : absl::Now();
  if (!last_step_at_.has_value()) {
    estimator_.Add(step.seconds());  // No interval yet: the best guess.
  } else if (step.step() > last_step_) {
    estimator_.Add(absl::ToDoubleSeconds(now - *last_step_at_) /
                   static_cast<double>(step.step() - last_step_));
  }
  last_step_at_ = now;
  last_step_ = step.step();
  const std::optional<double> eta =
      estimator_.Remaining(step.step(), job.steps_total());
  const int64_t every = options_.log_every > 0
                            ? options_.log_every
                            : DefaultLogEvery(job.steps_total());
  // An evaluation is rare and wanted: its step is always logged.
  const bool log =
      ShouldLogStep(step.step(), job.steps_total(), every) || step.has_eval();
  if (options_.tty) {
    // The step lines scroll above the bar, as in the training logs people
    // know; "\033[K" clears what a longer previous line left behind.
    out_ << "\r";
    if (log) {
      out_ << FormatStepLine(step, job.steps_total(), eta) << "\033[K\n";
    }
    out_ << FormatProgressBar(step, job.steps_total(), eta, options_.bar_width)
         << "\033[K";
    bar_showing_ = true;
  } else if (log) {
    out_ << FormatStepLine(step, job.steps_total(), eta) << "\n";
  }
  out_.flush();
}

void WatchPrinter::PrintOutcome(const v1::Job& job) {
  EndBar();
  out_ << FormatOutcome(job) << "\n";
  out_.flush();
}

void WatchPrinter::EndBar() {
  if (!bar_showing_) return;
  out_ << "\n";
  out_.flush();
  bar_showing_ = false;
}

absl::StatusOr<v1::Job> WatchToEnd(CoordinatorClient& client,
                                   const std::string& id,
                                   const WatchOptions& options,
                                   std::ostream& out) {
  WatchPrinter printer(out, options);
  std::optional<v1::Job> last;
  absl::Status status = client.WatchJob(id, [&](const v1::JobEvent& event) {
    printer.OnEvent(event);
    last = event.job();
  });
  if (last.has_value() && proto::IsTerminal(last->state())) {
    // The final state arrived; how the stream closed afterwards does not
    // change the job's outcome.
    printer.PrintOutcome(*last);
    return *std::move(last);
  }
  if (!status.ok()) {
    printer.EndBar();
    return status;
  }
  return absl::UnavailableError(absl::StrCat(
      "the coordinator ended the watch of ", id, " before the job ended",
      last.has_value() ? absl::StrCat(" (last state ",
                                      proto::JobStateName(last->state()), ")")
                       : ""));
}

absl::Status JobOutcomeStatus(const v1::Job& job) {
  switch (job.state()) {
    case v1::SUCCEEDED:
      return absl::OkStatus();
    case v1::FAILED:
      return AlreadyReported(absl::StatusCode::kAborted,
                             absl::StrCat(job.id(), " FAILED: ", job.message()),
                             kExitFailure);
    case v1::CANCELLED:
      return AlreadyReported(
          absl::StatusCode::kCancelled,
          absl::StrCat(job.id(), " CANCELLED: ", job.message()), kExitFailure);
    default:
      return AlreadyReported(absl::StatusCode::kUnavailable,
                             absl::StrCat(job.id(), " has not ended: ",
                                          proto::JobStateName(job.state())),
                             kExitFailure);
  }
}

}  // namespace conveyor::cli
