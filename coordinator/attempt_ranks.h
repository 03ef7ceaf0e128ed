// AttemptRanks: the ranks of a placed job's current attempt as their
// reports come in: which have said they are ready (and where their data
// plane listens), and which have ended. A job leaves PLANNING when every
// rank is ready (StartJob then carries every endpoint) and its attempt is
// over when every rank has ended, or the failure grace runs out.
//
// Not thread-safe: JobManager's mutex guards it with the job.
#ifndef CONVEYOR_COORDINATOR_ATTEMPT_RANKS_H_
#define CONVEYOR_COORDINATOR_ATTEMPT_RANKS_H_

#include <string>
#include <vector>

#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

class AttemptRanks {
 public:
  // A fresh attempt of `ranks` ranks: none ready, none ended.
  void Start(int ranks);
  // A job restored from the state file, whose workers never heard of it
  // from this coordinator: every rank counts as ended.
  void StartEnded(int ranks);
  // Between attempts: no ranks.
  void Clear() { Start(0); }

  // Files `rank`'s JobReady. False (and nothing filed) for a rank out of
  // range or one that was ready already (a duplicate report).
  bool MarkReady(int rank, const v1::JobReady& ready);
  bool is_ready(int rank) const;
  bool all_ready() const;
  // By rank; meaningful once all_ready().
  const std::vector<v1::JobReady>& ready_reports() const { return reports_; }
  std::vector<std::string> endpoints() const;

  // No-op for a rank out of range.
  void MarkEnded(int rank);
  bool ended(int rank) const;
  bool all_ended() const;

  int size() const { return static_cast<int>(ready_.size()); }

 private:
  std::vector<bool> ready_;
  std::vector<v1::JobReady> reports_;
  std::vector<bool> ended_;
  int num_ready_ = 0;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_ATTEMPT_RANKS_H_
