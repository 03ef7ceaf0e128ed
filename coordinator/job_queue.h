// JobQueue: the jobs waiting for workers, by job number, in the order they
// are placed. Strict FIFO, so a large job cannot starve behind a stream of
// small ones; a restarted job goes to the head, since it was running and
// must not wait behind work submitted after it. Positions (1 = next) are
// what `conveyorctl jobs` shows.
//
// Not thread-safe: JobManager's mutex guards it.
#ifndef CONVEYOR_COORDINATOR_JOB_QUEUE_H_
#define CONVEYOR_COORDINATOR_JOB_QUEUE_H_

#include <cstdint>
#include <deque>
#include <optional>

namespace conveyor::coordinator {

class JobQueue {
 public:
  // At the tail. A number already queued stays where it is.
  void Add(uint64_t number);
  // At the head (a restarted job). A number already queued moves there.
  void AddFirst(uint64_t number);
  // No-op for a number not queued.
  void Remove(uint64_t number);

  std::optional<uint64_t> head() const;
  void PopHead();

  // 1 for the head, 0 for a number not queued.
  int PositionOf(uint64_t number) const;
  int size() const { return static_cast<int>(order_.size()); }
  bool empty() const { return order_.empty(); }
  // Head first.
  const std::deque<uint64_t>& order() const { return order_; }

 private:
  std::deque<uint64_t> order_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_JOB_QUEUE_H_
