// WatchHub: serves every open WatchJob stream from one thread, with gRPC's
// callback API, instead of holding a server thread per stream.
//
// With the synchronous API each watcher held one of the server's threads
// for as long as it watched: 792 watchers took every thread, and every other
// call, worker registration included, failed "Server Threadpool Exhausted".
// Here a watch is a reactor (grpc::ServerWriteReactor) that is idle between
// writes; the hub's thread wakes when any job has a new event (at most
// every 20 ms, so that a busy fleet's events are handed out in batches),
// gives the idle watches of the jobs with news their new events, and
// finishes the watches whose job has ended. Every 250 ms it looks at every
// watch, which notices a job forgotten and a coordinator shutting down. Threads
// stay flat however many watch (the StreamLimiter still caps them, per client
// host and in all, so one client cannot take all the memory either).
//
// Each watch writes one event at a time; its own state is only touched
// under the hub's mutex, and the gRPC calls (StartWrite, Finish) are made
// after it is released, so a reaction that gRPC runs inline cannot deadlock.
// A watch never has a Finish and a write outstanding together: Finish waits
// for the write's completion, and nothing is written after Finish.
//
// Thread-safe. Destroy the hub only after the server has shut down (every
// watch has finished).
#ifndef CONVEYOR_COORDINATOR_WATCH_HUB_H_
#define CONVEYOR_COORDINATOR_WATCH_HUB_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/job_manager.h"
#include "coordinator/stream_limiter.h"
#include "grpcpp/grpcpp.h"

namespace conveyor::coordinator {

class WatchHub {
 public:
  explicit WatchHub(JobManager* manager);
  ~WatchHub();
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // A reactor that streams the events of job `job_id` from the job as it is
  // now, holding `slot` until it ends; gRPC owns it (it deletes itself).
  grpc::ServerWriteReactor<v1::JobEvent>* Watch(std::string job_id,
                                                StreamLimiter::Slot slot);

  // Watches open now.
  int open() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Reactor;
  // A gRPC call to make once mu_ is released.
  struct Action {
    Reactor* reactor;
    bool finish;  // Else StartWrite of the reactor's current event.
    grpc::Status status;
  };

  void Run();
  // Gives `r` its job's new events, if it is idle; queues what to do.
  void Fill(Reactor* r, std::vector<Action>& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts `r`'s next write, or finishes it once its job ended and every
  // event is written.
  void Next(Reactor* r, std::vector<Action>& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(Reactor* r, grpc::Status status,
                    std::vector<Action>& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Perform(const std::vector<Action>& actions);

  // From the reactors, on gRPC's threads.
  void Started(Reactor* r) ABSL_LOCKS_EXCLUDED(mu_);
  void WriteDone(Reactor* r, bool ok) ABSL_LOCKS_EXCLUDED(mu_);
  void Cancelled(Reactor* r) ABSL_LOCKS_EXCLUDED(mu_);
  void Done(Reactor* r) ABSL_LOCKS_EXCLUDED(mu_);

  JobManager* const manager_;
  mutable absl::Mutex mu_;
  std::set<Reactor*> reactors_ ABSL_GUARDED_BY(mu_);
  // The same watches by the job they watch: a pass looks only at those of
  // the jobs with news.
  std::map<std::string, std::set<Reactor*>> by_job_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_WATCH_HUB_H_
