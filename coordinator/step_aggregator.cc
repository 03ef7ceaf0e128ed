#include "coordinator/step_aggregator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "telemetry/step_timeline.h"

namespace conveyor::coordinator {

v1::StepSummary SummarizeStep(int64_t step,
                              const std::vector<v1::StepReport>& reports,
                              const StepRates& rates) {
  v1::StepSummary s;
  s.set_step(step);
  double receive_wait = 0, grad_squared_sum = 0;
  int64_t origin = std::numeric_limits<int64_t>::max();
  std::vector<telemetry::RankSpans> timeline;
  timeline.reserve(reports.size());
  for (int r = 0; r < static_cast<int>(reports.size()); ++r) {
    const v1::StepReport& rr = reports[r];
    s.set_seconds(std::max(s.seconds(), rr.seconds()));
    if (rr.has_loss()) {
      s.set_has_loss(true);
      s.set_loss(rr.loss());
    }
    s.set_learning_rate(rr.learning_rate());
    if (rr.has_eval()) {
      s.set_has_eval(true);
      s.set_eval_seconds(std::max(s.eval_seconds(), rr.eval_seconds()));
    }
    if (rr.eval_has_loss()) {
      s.set_eval_loss(rr.eval_loss());
      s.set_eval_perplexity(rr.eval_perplexity());
    }
    if (rr.seconds() > 0) receive_wait += rr.wait_seconds() / rr.seconds();
    grad_squared_sum += rr.grad_squared_sum();
    timeline.push_back({rr.start_unix_us(), &rr.spans()});
    origin = std::min(origin, rr.start_unix_us());
    v1::RankStep* rs = s.add_ranks();
    rs->set_rank(r);
    rs->set_seconds(rr.seconds());
    rs->set_wait_seconds(rr.wait_seconds());
    rs->set_peak_activation_bytes(rr.peak_activation_bytes());
    rs->set_peak_in_flight(rr.peak_in_flight());
    rs->set_peak_memory_allocated_bytes(rr.peak_memory_allocated_bytes());
    rs->set_peak_memory_reserved_bytes(rr.peak_memory_reserved_bytes());
    rs->set_memory_capacity_bytes(rr.memory_capacity_bytes());
    if (rr.peak_memory_reserved_bytes() > s.peak_memory_reserved_bytes()) {
      s.set_peak_memory_allocated_bytes(rr.peak_memory_allocated_bytes());
      s.set_peak_memory_reserved_bytes(rr.peak_memory_reserved_bytes());
      s.set_memory_capacity_bytes(rr.memory_capacity_bytes());
    }
  }
  if (!reports.empty()) {
    s.set_receive_wait_fraction(receive_wait / reports.size());
    // The trace SVG's bubble, from the same boxes (telemetry/step_timeline.h).
    s.set_bubble_fraction(
        telemetry::ScheduleBubble(telemetry::ActionBoxes(timeline, origin)));
  }
  // A worker's garbage must not turn into a NaN on every dashboard.
  if (grad_squared_sum > 0 && std::isfinite(grad_squared_sum)) {
    s.set_grad_norm(std::sqrt(grad_squared_sum));
  }
  if (s.seconds() > 0) {
    s.set_samples_per_second(rates.samples_per_step / s.seconds());
    s.set_tokens_per_second(s.samples_per_second() * rates.tokens_per_sample);
    if (rates.peak_flops > 0) {
      s.set_mfu(s.samples_per_second() * rates.flops_per_sample /
                rates.peak_flops);
    }
    const double devices = static_cast<double>(reports.size()) *
                           std::max(rates.devices_per_rank, 1);
    if (rates.flops_per_sample > 0 && devices > 0) {
      s.set_tflops_per_device(s.samples_per_second() * rates.flops_per_sample /
                              devices / 1e12);
    }
  }
  return s;
}

std::optional<v1::StepSummary> StepAggregator::Add(int rank, int num_ranks,
                                                   const v1::StepReport& report,
                                                   const StepRates& rates) {
  if (rank < 0 || rank >= num_ranks) return std::nullopt;
  Pending& pending = pending_[report.step()];
  if (pending.reports.empty()) pending.reports.resize(num_ranks);
  if (pending.reports[rank].step() != 0) return std::nullopt;  // Duplicate.
  pending.reports[rank] = report;
  if (++pending.count < num_ranks) return std::nullopt;

  v1::StepSummary summary =
      SummarizeStep(report.step(), pending.reports, rates);
  timelines_.emplace_back(report.step(), std::move(pending.reports));
  while (static_cast<int>(timelines_.size()) > trace_steps_) {
    timelines_.pop_front();
  }
  pending_.erase(report.step());
  return summary;
}

const StepAggregator::Timelines* StepAggregator::Find(int64_t step) const {
  if (timelines_.empty()) return nullptr;
  if (step == 0) return &timelines_.back();
  for (const Timelines& entry : timelines_) {
    if (entry.first == step) return &entry;
  }
  return nullptr;
}

}  // namespace conveyor::coordinator
