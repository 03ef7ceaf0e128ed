// ProfileJobModel: a worker's answer to ProfileModel (a `stages: auto` job,
// before it is cut): the job's layers timed on this worker's device
// (engine/profiler.h) and the latency of a transfer here, for the
// coordinator's choice of cut and schedule. It also returns the job file as
// parsed, which the worker keeps for the job's PrepareJob, so the file is
// parsed once in this process (job/parsed_job.h).
//
// Thread-compatible; runs on the job's thread, stopped by its cancellation
// (common/cancellation.h).
#ifndef CONVEYOR_WORKER_MODEL_PROFILE_H_
#define CONVEYOR_WORKER_MODEL_PROFILE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "conveyor/v1/conveyor.pb.h"
#include "job/parsed_job.h"
#include "worker/device_backends.h"

namespace conveyor::worker {

struct ProfiledJob {
  v1::ModelProfile profile;
  std::shared_ptr<const job::ParsedJob> parsed;
};

// Profiles the job of `request` on `backends` (nullptr: the CPU), labelled
// with `devices`. InvalidArgument for a job that does not parse;
// ResourceExhausted for a model too large for this worker; Cancelled when
// the job is cancelled meanwhile.
absl::StatusOr<ProfiledJob> ProfileJobModel(
    const v1::ProfileModel& request, DeviceBackends* backends,
    absl::Span<const std::string> devices);

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_MODEL_PROFILE_H_
