// WorkerRegistry: the workers a coordinator knows. Registration (the
// version and name checks, one live worker per name), ids ("worker-<n>" in
// registration order), heartbeats and the discount of the coordinator's own
// stalls, and lookup. What the workers run is JobManager's business.
//
// Not thread-safe: JobManager holds it under its mutex.
#ifndef CONVEYOR_COORDINATOR_WORKER_REGISTRY_H_
#define CONVEYOR_COORDINATOR_WORKER_REGISTRY_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

// The coordinator's end of one worker's session.
class WorkerConnection {
 public:
  virtual ~WorkerConnection() = default;
  // Queues `message` for the worker; never blocks. False once closed.
  virtual bool Send(const v1::CoordinatorMessage& message) = 0;
  // Ends the session (the worker sees the stream end with `status`).
  virtual void Close(const absl::Status& status) = 0;
};

struct WorkerRecord {
  v1::Worker info;    // info.draining: given no jobs, not counted live.
  bool left = false;  // Draining, and told to Leave.
  std::shared_ptr<WorkerConnection> connection;
  std::chrono::steady_clock::time_point last_seen;
};

class WorkerRegistry {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  // Workers must run `version` (any, when empty) and this build's control
  // protocol.
  explicit WorkerRegistry(std::string version) : version_(std::move(version)) {}

  // Whether `request` may register at all: FailedPrecondition naming both
  // versions on a skew; InvalidArgument for a missing name or devices, or a
  // name too long or with control characters (names reach terminals, logs
  // and metric labels).
  absl::Status CheckRequest(const v1::RegisterRequest& request) const;

  // Lost workers listed at most (Add forgets the oldest beyond).
  static constexpr size_t kMaxLostWorkers = 256;

  // Registers a checked request as IDLE, seen at `now`. AlreadyExists when
  // a live worker has the name (a lost one's name is free again: a
  // restarted worker registers under its old name, and the lost record of
  // that name is forgotten). Keeps at most kMaxLostWorkers lost records,
  // forgetting the oldest.
  absl::StatusOr<WorkerRecord*> Add(
      const v1::RegisterRequest& request,
      std::shared_ptr<WorkerConnection> connection, TimePoint now,
      int64_t now_unix_ms);

  // nullptr for an unknown id.
  WorkerRecord* Find(const std::string& id);
  const WorkerRecord* Find(const std::string& id) const;
  // Forgets a worker (it deregistered); pointers to others stay valid.
  void Erase(const std::string& id);

  // Workers neither LOST nor draining with at least `min_devices` devices.
  int Live(int64_t min_devices = 1) const;
  // IDLE workers not draining with at least `min_devices` devices, in
  // registration order.
  std::vector<WorkerRecord*> Idle(int64_t min_devices);
  // Workers not LOST that were last seen longer than `timeout` before `now`.
  std::vector<WorkerRecord*> Silent(TimePoint now, Duration timeout);
  // The coordinator itself did not run for `gap`: the heartbeats sent
  // meanwhile wait unread in their sockets, so that time is no worker's
  // silence. Moves every last_seen forward by `gap`, not past `now` (one
  // read during the gap by a thread that did run is already recent).
  void DiscountStall(Duration gap, TimePoint now);

  bool empty() const { return workers_.empty(); }
  // Every worker, LOST ones included, in registration order.
  std::vector<const WorkerRecord*> All() const;

 private:
  const std::string version_;
  int64_t next_ = 1;
  // By the number in "worker-<n>".
  std::map<int64_t, WorkerRecord> workers_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_WORKER_REGISTRY_H_
