// Delay: an identity layer (y = x, dx = dy, no parameters) that takes a fixed
// wall-clock time in each action: forward, input backward (BI) and weight
// backward (BW). It stands in for compute of known cost, so a test or a
// benchmark can compare a pipeline's measured step time with the schedule
// simulator's prediction without depending on the machine's speed.
//
// The wait sleeps until shortly before the deadline and spins only for the
// rest: a pure busy-wait would take a core from the other ranks (a P = 4
// pipeline runs four ranks on a 2-core CI machine), and a pure sleep
// overshoots by the kernel's timer slack (50 us by default) plus the wake-up
// latency, which a pipeline's critical path pays once per action. Waits are
// lower bounds: a loaded machine can only make an action later, never
// shorter, except that a cancelled job's wait ends early with the cancel's
// status (a minute-long delay must not hold a cancelled job). Under remat the
// BI recomputes the forward, so it waits for both.
//
// The output is the input tensor itself, not a copy: a copy would add time
// the configuration does not ask for, and tensors are never written after
// they are produced. Thread-compatible, like every layer.
#ifndef CONVEYOR_ENGINE_LAYERS_DELAY_H_
#define CONVEYOR_ENGINE_LAYERS_DELAY_H_

#include <chrono>

#include "engine/layer.h"

namespace conveyor::engine {

// The margin for the wake-up latency: how long before the deadline the sleep
// aims to end, on top of the thread's timer slack.
inline constexpr std::chrono::microseconds kDelaySpinWindow{50};

// Waits of more than this block on the calling thread's cancellation
// (common/cancellation.h) until this long before their end, so a cancelled
// job leaves a one-minute wait at once; the end itself is timed as below.
inline constexpr std::chrono::milliseconds kDelayCancelWindow{5};

// Returns OK at or after `deadline` (steady clock): sleeps until the timer
// slack plus kDelaySpinWindow before it (about 100 us with Linux's default
// slack), then spins. Reads the calling thread's timer slack on each call.
// Returns the cancellation's status early once the calling thread's job is
// cancelled (at most kDelayCancelWindow late).
absl::Status WaitUntil(std::chrono::steady_clock::time_point deadline);

class Delay final : public Layer {
 public:
  // Milliseconds per action, each >= 0 (the model spec bounds them by
  // kMaxDelayMs).
  Delay(double forward_ms, double backward_input_ms, double backward_weight_ms);

  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  // Waits even when need_dx is false: the first stage's backward still costs
  // its time.
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;

  std::chrono::nanoseconds forward_time() const { return forward_; }
  std::chrono::nanoseconds backward_input_time() const {
    return backward_input_;
  }
  std::chrono::nanoseconds backward_weight_time() const {
    return backward_weight_;
  }

 private:
  std::chrono::nanoseconds forward_;
  std::chrono::nanoseconds backward_input_;
  std::chrono::nanoseconds backward_weight_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_DELAY_H_
