#include "coordinator/job_states.h"

namespace conveyor::coordinator {

bool CanMoveJob(v1::JobState from, v1::JobState to) {
  const bool ends = to == v1::FAILED || to == v1::CANCELLED;
  switch (from) {
    case v1::QUEUED:
      return to == v1::PLANNING || ends;
    case v1::PLANNING:
      return to == v1::RUNNING || to == v1::QUEUED || ends;
    case v1::RUNNING:
      return to == v1::SUCCEEDED || to == v1::QUEUED || ends;
    default:  // Final, or never a job's state.
      return false;
  }
}

}  // namespace conveyor::coordinator
