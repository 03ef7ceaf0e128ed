#include "worker/step_report.h"

namespace conveyor::worker {

void FillStepReport(const RankStepResult& result, v1::StepReport* report) {
  report->set_seconds(result.seconds);
  report->set_wait_seconds(result.wait_seconds);
  report->set_has_loss(result.has_loss);
  report->set_loss(result.loss);
  report->set_peak_activation_bytes(result.peak_activation_bytes);
  report->set_peak_in_flight(result.peak_in_flight);
  report->set_grad_squared_sum(result.grad_squared_sum);
  report->set_peak_memory_allocated_bytes(result.memory.peak_allocated);
  report->set_peak_memory_reserved_bytes(result.memory.peak_reserved);
  report->set_memory_capacity_bytes(result.memory.capacity);
  report->set_start_unix_us(result.start_unix_us);
  report->mutable_spans()->Reserve(static_cast<int>(result.spans.size()));
  for (const telemetry::Span& span : result.spans) {
    v1::Span* out = report->add_spans();
    // SpanKind's values are v1::Span::Kind's.
    out->set_kind(static_cast<v1::Span::Kind>(span.kind));
    out->set_stage(span.stage);
    out->set_microbatch(span.microbatch);
    out->set_start_us(span.start_us);
    out->set_duration_us(span.duration_us);
    out->set_peer(span.peer);
    out->set_bytes(span.bytes);
  }
}

void FillEvalReport(const RankEvalResult& eval, v1::StepReport* report) {
  report->set_has_eval(true);
  report->set_eval_seconds(eval.eval.seconds);
  if (!eval.has_loss) return;
  report->set_eval_has_loss(true);
  report->set_eval_loss(eval.eval.loss);
  report->set_eval_perplexity(eval.eval.perplexity.value_or(0));
}

}  // namespace conveyor::worker
