#include "telemetry/span_recorder.h"

namespace conveyor::telemetry {

const char* SpanKindName(SpanKind kind) {
  switch (kind) {
    case SpanKind::kForward:
      return "forward";
    case SpanKind::kBackward:
      return "backward";
    case SpanKind::kBackwardInput:
      return "backward input";
    case SpanKind::kBackwardWeight:
      return "backward weight";
    case SpanKind::kLoss:
      return "loss";
    case SpanKind::kData:
      return "data";
    case SpanKind::kSend:
      return "send";
    case SpanKind::kRecvWait:
      return "recv wait";
    case SpanKind::kOptimizer:
      return "optimizer";
    case SpanKind::kAllReduce:
      return "all-reduce";
  }
  return "unknown";
}

SpanClass ClassOf(SpanKind kind) {
  switch (kind) {
    case SpanKind::kSend:
    case SpanKind::kAllReduce:
      return SpanClass::kCommunication;
    case SpanKind::kRecvWait:
      return SpanClass::kIdle;
    default:
      return SpanClass::kCompute;
  }
}

void SpanRecorder::StartStep() {
  spans_.clear();  // Keeps the capacity: no allocation after the first step.
  last_end_us_ = 0;
  if (!enabled_) return;
  step_start_ = Clock::now();
  step_start_unix_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
}

SpanRecorder::Clock::time_point SpanRecorder::Record(SpanKind kind,
                                                     int32_t stage,
                                                     int32_t microbatch,
                                                     int32_t peer,
                                                     uint64_t bytes) {
  if (!enabled_) return Clock::time_point();
  const Clock::time_point now = Clock::now();
  // Ends are rounded from the step's start, so that rounding never
  // accumulates over a step's many spans.
  const int64_t end_us =
      std::chrono::duration_cast<std::chrono::microseconds>(now - step_start_)
          .count();
  spans_.push_back(Span{.kind = kind,
                        .stage = stage,
                        .microbatch = microbatch,
                        .peer = peer,
                        .start_us = last_end_us_,
                        .duration_us = end_us - last_end_us_,
                        .bytes = bytes});
  last_end_us_ = end_us;
  return now;
}

}  // namespace conveyor::telemetry
