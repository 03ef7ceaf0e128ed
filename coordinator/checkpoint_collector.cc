#include "coordinator/checkpoint_collector.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace conveyor::coordinator {

void CheckpointCollector::Start(std::vector<int> stage_ranks,
                                int64_t first_step, int64_t last_step) {
  stage_ranks_ = std::move(stage_ranks);
  first_step_ = first_step;
  last_step_ = last_step;
  pending_.clear();
}

absl::StatusOr<std::optional<CheckpointCollector::StepFiles>>
CheckpointCollector::Add(
    int rank, int64_t step,
    const google::protobuf::RepeatedPtrField<v1::StageFile>& files) {
  if (step <= first_step_ || step > last_step_) return std::nullopt;
  const int num_stages = static_cast<int>(stage_ranks_.size());
  for (const v1::StageFile& f : files) {
    if (f.stage() < 0 || f.stage() >= num_stages ||
        stage_ranks_[f.stage()] != rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("reported a checkpoint file for stage ", f.stage(),
                       ", which it does not hold"));
    }
  }
  StepFiles& filed = pending_[step];
  for (const v1::StageFile& f : files) filed[f.stage()] = f;
  if (static_cast<int>(filed.size()) < num_stages) return std::nullopt;
  StepFiles complete = std::move(filed);
  pending_.erase(step);
  return std::optional<StepFiles>(std::move(complete));
}

}  // namespace conveyor::coordinator
