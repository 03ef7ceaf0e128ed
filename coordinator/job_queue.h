// JobQueue: the jobs waiting for workers, by job number, in the order the
// Placer considers them (coordinator/placer.h; docs/jobs.md "Priority and
// owner").
//
// The order is by effective priority, highest first: the job's priority
// (job/job_policy.h: low 0, normal 100, high 200, urgent 300, or an integer)
// plus its aging, floor(aging_per_minute x the minutes it has waited
// queued), so that a job of low priority is not starved by a stream of
// higher ones: it rises one class per 100 / aging_per_minute minutes.
// Equal effective priorities keep submission order (first come, first
// served). A restarted job (a lost worker, a drain, a preemption) was
// running and must not wait behind work of its priority submitted after it:
// it ages as if it had waited as long as the longest-waiting job of its
// priority, and goes first among equals. Its own queued time is kept across
// attempts; its running time is not a wait.
//
// The order is recomputed at Reorder(now) (and by every Add), since aging
// moves it with time; positions (1 = next) are what `conveyorctl jobs`
// shows.
//
// Not thread-safe: JobManager's mutex guards it.
#ifndef CONVEYOR_COORDINATOR_JOB_QUEUE_H_
#define CONVEYOR_COORDINATOR_JOB_QUEUE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>

namespace conveyor::coordinator {

class JobQueue {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  // job::kPriorityNormal (the queue does not depend on the job module).
  static constexpr int kDefaultPriority = 100;
  // Priority points a queued job gains per minute waited; the coordinator's
  // --aging-per-minute (0: no aging). At 1, a low job waiting 100 minutes
  // ranks with normal ones submitted now, and after 300 with urgent ones.
  static constexpr double kDefaultAgingPerMinute = 1.0;

  explicit JobQueue(double aging_per_minute = kDefaultAgingPerMinute)
      : aging_per_minute_(aging_per_minute) {}

  // Queues `number` at `priority`, having already waited `waited` in
  // earlier queued spells (a restored job). `now` defaults to the newest
  // time the queue was given (or, before any, the next Reorder's). A
  // number already queued stays where it is.
  void Add(uint64_t number, int priority = kDefaultPriority,
           std::optional<TimePoint> now = std::nullopt, Duration waited = {});
  // A restarted job: first among its priority (see above). A number
  // already queued is queued again this way.
  void AddFirst(uint64_t number, int priority = kDefaultPriority,
                std::optional<TimePoint> now = std::nullopt,
                Duration waited = {});
  // No-op for a number not queued.
  void Remove(uint64_t number);

  // Recomputes the effective priorities and the order at `now` (aging).
  void Reorder(TimePoint now);

  std::optional<uint64_t> head() const;
  void PopHead();

  // 1 for the head, 0 for a number not queued.
  int PositionOf(uint64_t number) const;
  bool contains(uint64_t number) const { return entries_.contains(number); }
  int size() const { return static_cast<int>(order_.size()); }
  bool empty() const { return order_.empty(); }
  // Head first, as of the last Reorder or Add.
  const std::deque<uint64_t>& order() const { return order_; }

  // As of the last Reorder or Add; 0 for a number not queued.
  int EffectivePriority(uint64_t number) const;
  // Time `number` has waited queued, over all its spells, at `now` (the
  // newest time the queue was given by default); zero when not queued.
  Duration Waited(uint64_t number,
                  std::optional<TimePoint> now = std::nullopt) const;

 private:
  struct Entry {
    int priority = kDefaultPriority;
    Duration waited_before{};  // Earlier spells.
    // This spell; nullopt for a job added before the queue was given any
    // time, whose spell starts at the first Reorder.
    std::optional<TimePoint> since;
    bool restarted = false;
    // Submission order; restarted jobs count down from -1, so the newest
    // restart goes first among restarted equals.
    int64_t seq = 0;
    int effective = 0;
  };

  // floor(aging_per_minute_ x minutes), bounded.
  int Aging(Duration waited) const;
  // Recomputes effective priorities and the order at now_.
  void Sort();
  std::optional<TimePoint> Now(std::optional<TimePoint> now);

  double aging_per_minute_;
  // The newest time given; nullopt before the first.
  std::optional<TimePoint> now_;
  int64_t next_seq_ = 0;
  int64_t next_restart_seq_ = -1;
  std::map<uint64_t, Entry> entries_;
  std::deque<uint64_t> order_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_JOB_QUEUE_H_
