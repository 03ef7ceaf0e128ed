#include "coordinator/event_log.h"

#include <algorithm>
#include <utility>

namespace conveyor::coordinator {

EventLog::EventLog(int max_events) : max_events_(std::max(1, max_events)) {}

void EventLog::Add(v1::JobEvent event) {
  events_.push_back(std::move(event));
  DropOldest(max_events_);
}

void EventLog::KeepNewest(int newest) {
  DropOldest(std::max(1, newest));
  // Once, when a job ends: shrinking a deque copies what it keeps.
  events_.shrink_to_fit();
}

void EventLog::DropOldest(int keep) {
  while (static_cast<int>(events_.size()) > keep) {
    events_.pop_front();
    ++first_;
  }
}

int64_t EventLog::Normalize(int64_t cursor) const {
  if (cursor < 0) return std::max(first_, end() - 1);
  return std::max(cursor, first_);
}

std::vector<v1::JobEvent> EventLog::Read(int64_t* cursor) const {
  std::vector<v1::JobEvent> out;
  for (*cursor = Normalize(*cursor); *cursor < end(); ++*cursor) {
    out.push_back(events_[*cursor - first_]);
  }
  return out;
}

}  // namespace conveyor::coordinator
