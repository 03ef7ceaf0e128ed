// SimFleet: many simulated workers in one process, each speaking the real
// WorkerSession protocol (proto/conveyor/v1/conveyor.proto) to a real
// coordinator: it registers, heartbeats at the interval the coordinator
// gives, answers PrepareJob with JobReady, runs the job's steps after
// StartJob with the stage compute replaced by a sleep (one StepReport per
// step, with a span per action of its program), reports checkpoints
// (CheckpointSaved for its stages, files it never writes) and the job's end,
// and obeys CancelJob, DrainJob and Leave. What the coordinator does with
// all that is what the fleet simulator measures (bench/fleet_simulator.cc).
//
// The workers are gRPC callback reactors sharing a few connections (a real
// worker has its own; --workers-per-connection sets the sharing) and one
// timer thread, so 4,096 of them fit a small machine.
//
// Thread-safe: gRPC runs the reactors' callbacks on its threads; the timer
// thread fires heartbeats and steps.
#ifndef CONVEYOR_BENCH_FLEET_SIM_WORKERS_H_
#define CONVEYOR_BENCH_FLEET_SIM_WORKERS_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/v1/conveyor.grpc.pb.h"

namespace conveyor::bench {

struct SimFleetOptions {
  std::string coordinator;  // host:port
  int workers = 64;
  int workers_per_connection = 16;
  // The sleep that stands for a step's compute.
  std::chrono::milliseconds step_time{1000};
  // The jobs' checkpoint.every (the simulator writes the jobs): a worker
  // whose program has a checkpoint directory reports its stages' files
  // after every such step. 0: never.
  int64_t checkpoint_every = 0;
};

class SimWorker;

class SimFleet {
 public:
  // Opens every worker's session (registration proceeds in the background:
  // see registered()).
  explicit SimFleet(SimFleetOptions options);
  // Cancels every session and waits for them to end.
  ~SimFleet();
  SimFleet(const SimFleet&) = delete;
  SimFleet& operator=(const SimFleet&) = delete;

  // Workers the coordinator has answered Registered.
  int registered() const { return registered_.load(); }
  // Sessions that ended (refused, or broken).
  int ended() const { return ended_.load(); }

  struct Counters {
    int64_t heartbeats = 0;
    int64_t steps = 0;        // StepReports sent.
    int64_t checkpoints = 0;  // CheckpointSaved sent.
    int64_t jobs_ended = 0;   // JobEnded sent.
  };
  Counters counters() const;

 private:
  friend class SimWorker;
  enum class Event { kHeartbeat, kStep };
  struct Timer {
    std::chrono::steady_clock::time_point when;
    int worker;
    Event event;
    uint64_t generation;  // A step timer of an older job is stale.
    bool operator>(const Timer& o) const { return when > o.when; }
  };

  void Schedule(Timer timer);
  void RunTimers();

  const SimFleetOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::WorkerSession::Stub>> stubs_;
  std::vector<std::unique_ptr<SimWorker>> workers_;

  std::mutex timers_mu_;
  std::condition_variable timers_cv_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  bool stopping_ = false;
  std::thread timer_thread_;

  std::atomic<int> registered_{0};
  std::atomic<int> ended_{0};
  std::atomic<int64_t> heartbeats_{0};
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> checkpoints_{0};
  std::atomic<int64_t> jobs_ended_{0};
};

}  // namespace conveyor::bench

#endif  // CONVEYOR_BENCH_FLEET_SIM_WORKERS_H_
