// EventLog: one job's events for WatchJob, numbered from 0 in the order they
// happened and bounded: the oldest are dropped first, so a watcher that falls
// behind skips them rather than holding the coordinator's memory.
//
// Not thread-safe: JobManager holds one per job under its mutex.
#ifndef CONVEYOR_COORDINATOR_EVENT_LOG_H_
#define CONVEYOR_COORDINATOR_EVENT_LOG_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

class EventLog {
 public:
  // Keeps at most `max_events` (at least one).
  explicit EventLog(int max_events);

  void Add(v1::JobEvent event);
  // Drops all but the newest `newest` events (at least one): an ended job
  // keeps only what a late watcher needs.
  void KeepNewest(int newest);

  // Sequence numbers: [first(), end()) are kept.
  int64_t first() const { return first_; }
  int64_t end() const { return first_ + static_cast<int64_t>(events_.size()); }

  // Where a watcher with `cursor` reads next: a negative cursor (a new
  // watcher) starts at the latest event, the job as it is now; one below
  // first() at first().
  int64_t Normalize(int64_t cursor) const;
  // The events from Normalize(*cursor) on; advances *cursor to end().
  std::vector<v1::JobEvent> Read(int64_t* cursor) const;

 private:
  void DropOldest(int keep);

  int max_events_;
  std::deque<v1::JobEvent> events_;
  int64_t first_ = 0;  // Sequence number of events_.front().
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_EVENT_LOG_H_
