#include "coordinator/job_queue.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace conveyor::coordinator {

namespace {

// Aging stops here: far above any priority a job file can give, so a job
// that waited for years still orders sensibly and nothing overflows.
constexpr double kMaxAging = 1 << 20;

}  // namespace

std::optional<JobQueue::TimePoint> JobQueue::Now(std::optional<TimePoint> now) {
  if (now.has_value()) now_ = std::max(now_.value_or(*now), *now);
  return now_;
}

void JobQueue::Add(uint64_t number, int priority, std::optional<TimePoint> now,
                   Duration waited) {
  const std::optional<TimePoint> t = Now(now);
  if (!entries_.contains(number)) {
    entries_[number] = Entry{.priority = priority,
                             .waited_before = waited,
                             .since = t,
                             .seq = next_seq_++};
  }
  Sort();
}

void JobQueue::AddFirst(uint64_t number, int priority,
                        std::optional<TimePoint> now, Duration waited) {
  const std::optional<TimePoint> t = Now(now);
  entries_[number] = Entry{.priority = priority,
                           .waited_before = waited,
                           .since = t,
                           .restarted = true,
                           .seq = next_restart_seq_--};
  Sort();
}

void JobQueue::Remove(uint64_t number) {
  if (entries_.erase(number) > 0) std::erase(order_, number);
}

int JobQueue::Aging(Duration waited) const {
  const double minutes = std::chrono::duration<double>(waited).count() / 60;
  const double aging = std::floor(aging_per_minute_ * std::max(0.0, minutes));
  return static_cast<int>(std::clamp(aging, 0.0, kMaxAging));
}

void JobQueue::Reorder(TimePoint now) {
  Now(now);
  for (auto& [number, e] : entries_) {
    if (!e.since.has_value()) e.since = now_;
  }
  Sort();
}

void JobQueue::Sort() {
  // The longest wait at each priority, which restarted jobs age by.
  std::map<int, Duration> longest;
  for (const auto& [number, e] : entries_) {
    Duration& l = longest[e.priority];
    l = std::max(l, Waited(number));
  }
  order_.clear();
  for (auto& [number, e] : entries_) {
    const Duration waited = e.restarted ? longest[e.priority] : Waited(number);
    e.effective = e.priority + Aging(waited);
    order_.push_back(number);
  }
  std::sort(order_.begin(), order_.end(), [&](uint64_t a, uint64_t b) {
    const Entry& x = entries_.at(a);
    const Entry& y = entries_.at(b);
    return std::make_tuple(-x.effective, !x.restarted, x.seq) <
           std::make_tuple(-y.effective, !y.restarted, y.seq);
  });
}

std::optional<uint64_t> JobQueue::head() const {
  if (order_.empty()) return std::nullopt;
  return order_.front();
}

void JobQueue::PopHead() {
  if (!order_.empty()) Remove(order_.front());
}

int JobQueue::PositionOf(uint64_t number) const {
  const auto it = std::find(order_.begin(), order_.end(), number);
  return it == order_.end() ? 0 : static_cast<int>(it - order_.begin()) + 1;
}

int JobQueue::EffectivePriority(uint64_t number) const {
  const auto it = entries_.find(number);
  return it == entries_.end() ? 0 : it->second.effective;
}

JobQueue::Duration JobQueue::Waited(uint64_t number,
                                    std::optional<TimePoint> now) const {
  const auto it = entries_.find(number);
  if (it == entries_.end()) return {};
  const Entry& e = it->second;
  if (!now.has_value()) now = now_;
  if (!now.has_value() || !e.since.has_value()) return e.waited_before;
  return e.waited_before + std::max(Duration{}, *now - *e.since);
}

}  // namespace conveyor::coordinator
