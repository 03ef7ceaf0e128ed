// BackgroundTask: runs one task at a time on its own thread, so the job
// thread can go on while a checkpoint is written (worker/job_runner.h).
// Starting a task first waits for the one before it: at most one is ever in
// flight, which bounds the host memory that snapshots waiting to be written
// can hold to one.
//
//   BackgroundTask writer;
//   ASSIGN_OR_RETURN(double waited, writer.Start([snapshot] { return
//   Write(snapshot); }));
//   ...
//   RETURN_IF_ERROR(writer.Wait());  // Before reporting the job's end.
//
// A task's error is returned by the next Start or Wait, whichever comes
// first, and only once. The destructor waits for the task in flight; a task
// that can take long must watch a cancellation of its own.
//
// Thread-safety: Start and Wait from one thread (the job thread); the task
// runs on another.
#ifndef CONVEYOR_WORKER_BACKGROUND_TASK_H_
#define CONVEYOR_WORKER_BACKGROUND_TASK_H_

#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor::worker {

class BackgroundTask {
 public:
  BackgroundTask() = default;
  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;
  ~BackgroundTask();

  // Waits for the task in flight, then starts `task`. Returns the seconds
  // waited, or the error of the task waited for (`task` is then not
  // started).
  absl::StatusOr<double> Start(std::function<absl::Status()> task);

  // Waits for the task in flight; its status (OK when there was none).
  absl::Status Wait();

  // Whether a task was started and not yet waited for.
  bool in_flight() const { return thread_.joinable(); }

 private:
  std::thread thread_;
  // Written by the task's thread before it ends; read after the join.
  absl::Status status_;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_BACKGROUND_TASK_H_
