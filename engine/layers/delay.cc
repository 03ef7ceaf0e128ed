#include "engine/layers/delay.h"

#include <thread>

#include "common/cancellation.h"
#include "common/status_macros.h"

#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace conveyor::engine {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::nanoseconds FromMillis(double ms) {
  return std::chrono::round<std::chrono::nanoseconds>(
      std::chrono::duration<double, std::milli>(ms));
}

// The calling thread's timer slack: how late the kernel may fire its sleep
// timers to batch wake-ups (50 us by default on Linux).
std::chrono::nanoseconds TimerSlack() {
#ifdef __linux__
  const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  if (slack > 0) return std::chrono::nanoseconds(slack);
#endif
  return std::chrono::nanoseconds(0);
}

// Waits `d` from now; a zero wait reads no clock.
absl::Status Wait(std::chrono::nanoseconds d) {
  if (d.count() <= 0) return absl::OkStatus();
  return WaitUntil(Clock::now() + d);
}

}  // namespace

absl::Status WaitUntil(Clock::time_point deadline) {
  // The sleep must end before the deadline even when the kernel fires its
  // timer as late as the slack allows, so it aims slack + kDelaySpinWindow
  // early (about 100 us by default); the spin then ends on the deadline.
  // sleep_until may also return early on a signal: the loop sleeps again.
  // The long part of a wait blocks on the job's cancellation instead, whose
  // wake-up is less precise: it ends kDelayCancelWindow before `wake`, and
  // the precise sleep does the rest.
  const Cancellation* cancellation = CurrentCancellation();
  const Clock::time_point wake = deadline - kDelaySpinWindow - TimerSlack();
  for (Clock::time_point now = Clock::now(); now < wake; now = Clock::now()) {
    if (cancellation != nullptr && wake - now > kDelayCancelWindow) {
      RETURN_IF_ERROR(cancellation->WaitUntil(wake - kDelayCancelWindow));
      continue;
    }
    std::this_thread::sleep_until(wake);
  }
  while (Clock::now() < deadline) {
  }
  return absl::OkStatus();
}

Delay::Delay(double forward_ms, double backward_input_ms,
             double backward_weight_ms)
    : forward_(FromMillis(forward_ms)),
      backward_input_(FromMillis(backward_input_ms)),
      backward_weight_(FromMillis(backward_weight_ms)) {}

absl::StatusOr<Tensor> Delay::Forward(const Tensor& x, Stash& /*stash*/) {
  RETURN_IF_ERROR(Wait(forward_));
  return x;
}

absl::StatusOr<Tensor> Delay::BackwardInput(const Tensor& dy, Stash& /*stash*/,
                                            bool need_dx) {
  RETURN_IF_ERROR(Wait(backward_input_));
  if (!need_dx) return Tensor();
  return dy;
}

absl::Status Delay::BackwardWeight(const Tensor& /*dy*/, Stash& /*stash*/) {
  return Wait(backward_weight_);
}

}  // namespace conveyor::engine
