// CheckpointCollector: the stage files a job's ranks report for each
// checkpoint step, until every stage of a step is in and the coordinator can
// commit it (checkpoint/resume.h: MakeManifest, then WriteManifest).
//
// A rank speaks only for the stages it holds: a report naming another
// rank's stage is refused, so one rank's file can never stand in for
// another's missing one. Reports for steps outside the attempt (at or
// before its resume step, after its last) are late or stray and ignored.
//
// Not thread-safe: JobManager's mutex guards it with the job.
#ifndef CONVEYOR_COORDINATOR_CHECKPOINT_COLLECTOR_H_
#define CONVEYOR_COORDINATOR_CHECKPOINT_COLLECTOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

class CheckpointCollector {
 public:
  // A step's files, by stage.
  using StepFiles = std::map<int, v1::StageFile>;

  // Starts an attempt: stage s is held by rank `stage_ranks[s]`; steps
  // after `first_step` up to `last_step` can be checkpointed. Forgets what
  // an earlier attempt reported.
  void Start(std::vector<int> stage_ranks, int64_t first_step,
             int64_t last_step);

  // Files `rank`'s report for `step`. Returns the step's files once this
  // report completes it (and forgets them), nullopt while stages are
  // missing or when the report is ignored, or InvalidArgument "reported a
  // checkpoint file for stage S, which it does not hold" (nothing of the
  // report is filed).
  absl::StatusOr<std::optional<StepFiles>> Add(
      int rank, int64_t step,
      const google::protobuf::RepeatedPtrField<v1::StageFile>& files);

  // Ends the attempt: forgets everything and ignores reports until the
  // next Start (late ones from the ranks of the attempt that ended).
  void Stop() { Start({}, 0, 0); }

  // Steps with some files reported and not yet complete.
  int pending_steps() const { return static_cast<int>(pending_.size()); }

 private:
  std::vector<int> stage_ranks_;
  int64_t first_step_ = 0;
  int64_t last_step_ = 0;
  std::map<int64_t, StepFiles> pending_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_CHECKPOINT_COLLECTOR_H_
