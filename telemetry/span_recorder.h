// SpanRecorder: a rank's timeline of one training step, as spans (what ran,
// on which stage and microbatch, when, for how long), for `conveyorctl trace`
// and the per-stage metrics.
//
// Recording costs one monotonic clock read and one vector append per span,
// with the vector's capacity kept across steps, so it stays on for every step
// (bench/pipeline_benchmark measures the difference). Times are microseconds
// from the step's start on a monotonic clock; the wall-clock start is kept
// once per step so that ranks on different machines can be laid side by side.
//
// Thread-compatible: the thread that runs the step records it.
#ifndef CONVEYOR_TELEMETRY_SPAN_RECORDER_H_
#define CONVEYOR_TELEMETRY_SPAN_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <vector>

namespace conveyor::telemetry {

// Values equal those of v1::Span::Kind, so conversion is a cast.
enum class SpanKind : uint8_t {
  kForward = 0,
  kBackward = 1,
  kBackwardInput = 2,
  kBackwardWeight = 3,
  kLoss = 4,
  kData = 5,
  kSend = 6,
  kRecvWait = 7,
  kOptimizer = 8,
  kAllReduce = 9,
};

// "forward", "recv wait", ...
const char* SpanKindName(SpanKind kind);

// How a span's time counts in a step: compute, communication on the compute
// thread, or idle (waiting for a tensor). The three add up to the step time.
enum class SpanClass : uint8_t { kCompute, kCommunication, kIdle };
SpanClass ClassOf(SpanKind kind);

struct Span {
  SpanKind kind = SpanKind::kForward;
  int32_t stage = -1;       // -1: not a stage's.
  int32_t microbatch = -1;  // -1: not a microbatch's.
  int32_t peer = -1;        // kSend / kRecvWait: the other rank.
  int64_t start_us = 0;     // From the step's start.
  int64_t duration_us = 0;
  uint64_t bytes = 0;  // kSend / kRecvWait: the tensor's size.
};

class SpanRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // A disabled recorder records nothing and reads no clock; for measuring
  // what recording costs (bench/telemetry_benchmark).
  explicit SpanRecorder(bool enabled = true) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  // Clears the previous step's spans and notes the step's start.
  void StartStep();

  // A span from where the previous one ended (the step's start for the
  // first) until now; returns now. Spans therefore tile the step with no
  // gaps: the executor's own bookkeeping between two spans counts into the
  // span that follows it, and compute + communication + idle is the step
  // time exactly, however the thread is scheduled between spans. The epoch
  // when disabled.
  Clock::time_point Record(SpanKind kind, int32_t stage = -1,
                           int32_t microbatch = -1, int32_t peer = -1,
                           uint64_t bytes = 0);

  Clock::time_point step_start() const { return step_start_; }
  int64_t step_start_unix_us() const { return step_start_unix_us_; }
  const std::vector<Span>& spans() const { return spans_; }

 private:
  bool enabled_ = true;
  Clock::time_point step_start_{};
  int64_t step_start_unix_us_ = 0;
  int64_t last_end_us_ = 0;  // From step_start_: where the next span starts.
  std::vector<Span> spans_;
};

}  // namespace conveyor::telemetry

#endif  // CONVEYOR_TELEMETRY_SPAN_RECORDER_H_
