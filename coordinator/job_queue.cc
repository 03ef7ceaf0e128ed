#include "coordinator/job_queue.h"

#include <algorithm>

namespace conveyor::coordinator {

void JobQueue::Add(uint64_t number) {
  if (PositionOf(number) == 0) order_.push_back(number);
}

void JobQueue::AddFirst(uint64_t number) {
  Remove(number);
  order_.push_front(number);
}

void JobQueue::Remove(uint64_t number) { std::erase(order_, number); }

std::optional<uint64_t> JobQueue::head() const {
  if (order_.empty()) return std::nullopt;
  return order_.front();
}

void JobQueue::PopHead() {
  if (!order_.empty()) order_.pop_front();
}

int JobQueue::PositionOf(uint64_t number) const {
  const auto it = std::find(order_.begin(), order_.end(), number);
  return it == order_.end() ? 0 : static_cast<int>(it - order_.begin()) + 1;
}

}  // namespace conveyor::coordinator
