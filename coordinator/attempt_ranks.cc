#include "coordinator/attempt_ranks.h"

#include <algorithm>

namespace conveyor::coordinator {

void AttemptRanks::Start(int ranks) {
  ready_.assign(ranks, false);
  reports_.assign(ranks, v1::JobReady());
  ended_.assign(ranks, false);
  num_ready_ = 0;
}

void AttemptRanks::StartEnded(int ranks) {
  Start(ranks);
  ended_.assign(ranks, true);
}

bool AttemptRanks::MarkReady(int rank, const v1::JobReady& ready) {
  if (rank < 0 || rank >= size() || ready_[rank]) return false;
  ready_[rank] = true;
  reports_[rank] = ready;
  ++num_ready_;
  return true;
}

bool AttemptRanks::is_ready(int rank) const {
  return rank >= 0 && rank < size() && ready_[rank];
}

bool AttemptRanks::all_ready() const { return num_ready_ == size(); }

std::vector<std::string> AttemptRanks::endpoints() const {
  std::vector<std::string> out;
  out.reserve(reports_.size());
  for (const v1::JobReady& r : reports_) out.push_back(r.data_endpoint());
  return out;
}

void AttemptRanks::MarkEnded(int rank) {
  if (rank >= 0 && rank < size()) ended_[rank] = true;
}

bool AttemptRanks::ended(int rank) const {
  return rank >= 0 && rank < size() && ended_[rank];
}

bool AttemptRanks::all_ended() const {
  return std::all_of(ended_.begin(), ended_.end(), [](bool b) { return b; });
}

}  // namespace conveyor::coordinator
