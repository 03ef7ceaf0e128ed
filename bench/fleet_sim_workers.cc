#include "bench/fleet_sim_workers.h"

#include <deque>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/build_info.h"  // kVersion: the coordinator checks it
#include "grpcpp/grpcpp.h"
#include "proto/protocol.h"  // kProtocolVersion

namespace conveyor::bench {
namespace {

int64_t NowUnixUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// One simulated worker: a bidirectional session stream with a write queue
// (gRPC allows one write in flight per stream) and the job it holds.
class SimWorker final : public grpc::ClientBidiReactor<v1::WorkerMessage,
                                                       v1::CoordinatorMessage> {
 public:
  SimWorker(SimFleet* fleet, int index, v1::WorkerSession::Stub* stub)
      : fleet_(fleet), index_(index), stub_(stub) {}

  // Opens the session and registers.
  void Start() {
    stub_->async()->Session(&context_, this);
    StartRead(&incoming_);
    StartCall();
    v1::WorkerMessage hello;
    v1::RegisterRequest* r = hello.mutable_register_();
    r->set_protocol_version(proto::kProtocolVersion);
    r->set_version(kVersion);
    r->set_name(absl::StrCat("sim-", index_));
    r->add_devices("cpu:1");
    r->set_data_address("127.0.0.1:0");
    Send(std::move(hello));
  }

  void Cancel() { context_.TryCancel(); }

  // Waits for OnDone (after Cancel).
  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_; });
  }

  // The timer thread's events.
  void Fire(SimFleet::Event event, uint64_t generation) {
    if (event == SimFleet::Event::kHeartbeat) {
      v1::WorkerMessage beat;
      std::chrono::milliseconds interval;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (done_) return;
        if (job_.has_value()) {
          beat.mutable_heartbeat()->set_job_id(job_->program.job_id());
        } else {
          beat.mutable_heartbeat();
        }
        interval = heartbeat_interval_;
      }
      fleet_->heartbeats_.fetch_add(1);
      Send(std::move(beat));
      fleet_->Schedule({std::chrono::steady_clock::now() + interval, index_,
                        SimFleet::Event::kHeartbeat, 0});
      return;
    }
    Step(generation);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // The stream ended; OnDone follows.
    Handle(incoming_);
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    v1::WorkerMessage* next = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) out_.clear();
      if (out_.empty()) {
        writing_ = false;
        return;
      }
      current_ = std::move(out_.front());
      out_.pop_front();
      next = &current_;
    }
    StartWrite(next);
  }

  void OnDone(const grpc::Status& /*status*/) override {
    fleet_->ended_.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    done_cv_.notify_all();
  }

 private:
  struct Job {
    v1::JobProgram program;
    uint64_t generation = 0;
    int64_t step = 0;  // Steps done.
    int64_t stop_after = 0;
    bool started = false;
  };

  void Send(v1::WorkerMessage message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      if (writing_) {
        out_.push_back(std::move(message));
        return;
      }
      writing_ = true;
      current_ = std::move(message);
    }
    StartWrite(&current_);
  }

  static v1::WorkerMessage Ended(const std::string& job_id, v1::JobState state,
                                 const std::string& message) {
    v1::WorkerMessage m;
    m.mutable_ended()->set_job_id(job_id);
    m.mutable_ended()->set_state(state);
    m.mutable_ended()->set_message(message);
    m.mutable_ended()->set_code(state == v1::CANCELLED ? 1 : 0);
    return m;
  }

  void Handle(const v1::CoordinatorMessage& m) {
    switch (m.kind_case()) {
      case v1::CoordinatorMessage::kRegistered: {
        const int64_t ms = m.registered().heartbeat_interval_ms();
        {
          std::lock_guard<std::mutex> lock(mu_);
          heartbeat_interval_ = std::chrono::milliseconds(ms > 0 ? ms : 1000);
        }
        fleet_->registered_.fetch_add(1);
        // Spread the fleet's heartbeats over the interval, as workers that
        // started at different times would be.
        const auto first = std::chrono::milliseconds(
            (static_cast<int64_t>(index_) * 7919) % (ms > 0 ? ms : 1000));
        fleet_->Schedule({std::chrono::steady_clock::now() + first, index_,
                          SimFleet::Event::kHeartbeat, 0});
        return;
      }
      case v1::CoordinatorMessage::kPrepare: {
        const v1::JobProgram& program = m.prepare().program();
        std::string busy_with;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (job_.has_value()) {
            busy_with = job_->program.job_id();
          } else {
            job_.emplace();
            job_->program = program;
            job_->generation = ++generation_;
          }
        }
        if (!busy_with.empty()) {
          // Refused as a real worker does.
          Send(Ended(program.job_id(), v1::FAILED,
                     absl::StrCat("worker busy with ", busy_with)));
          return;
        }
        v1::WorkerMessage ready;
        ready.mutable_ready()->set_job_id(program.job_id());
        ready.mutable_ready()->set_data_endpoint(
            absl::StrCat("127.0.0.1:", 20000 + index_));
        Send(std::move(ready));
        return;
      }
      case v1::CoordinatorMessage::kStart: {
        std::optional<SimFleet::Timer> timer;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (job_.has_value() &&
              job_->program.job_id() == m.start().job_id() && !job_->started) {
            job_->started = true;
            timer = SimFleet::Timer{
                std::chrono::steady_clock::now() + fleet_->options_.step_time,
                index_, SimFleet::Event::kStep, job_->generation};
          }
        }
        if (timer.has_value()) fleet_->Schedule(*timer);
        return;
      }
      case v1::CoordinatorMessage::kCancel: {
        std::string id;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (!job_.has_value() ||
              job_->program.job_id() != m.cancel().job_id()) {
            return;
          }
          id = job_->program.job_id();
          job_.reset();
        }
        fleet_->jobs_ended_.fetch_add(1);
        Send(Ended(id, v1::CANCELLED, m.cancel().reason()));
        return;
      }
      case v1::CoordinatorMessage::kDrain: {
        v1::WorkerMessage point;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (!job_.has_value() ||
              job_->program.job_id() != m.drain().job_id()) {
            return;
          }
          if (m.drain().stop_after_step() > 0) {
            job_->stop_after = m.drain().stop_after_step();
            return;
          }
          // This rank's next step boundary.
          point.mutable_drain_point()->set_job_id(m.drain().job_id());
          point.mutable_drain_point()->set_step(job_->step + 1);
        }
        Send(std::move(point));
        return;
      }
      case v1::CoordinatorMessage::kLeave:
        context_.TryCancel();
        return;
      case v1::CoordinatorMessage::kProfile: {
        // The simulator's jobs give their stages; a profile request means
        // a job this fleet cannot run.
        Send(Ended(m.profile().job_id(), v1::FAILED,
                   "the simulated worker cannot profile (stages: auto)"));
        return;
      }
      default:
        return;
    }
  }

  // One step of the job's "compute" is over: report it, and its checkpoint
  // and the job's end when due.
  void Step(uint64_t generation) {
    std::vector<v1::WorkerMessage> out;
    bool again = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_ || !job_.has_value() || job_->generation != generation) return;
      Job& job = *job_;
      const v1::JobProgram& p = job.program;
      const int64_t step = ++job.step;
      const double seconds =
          std::chrono::duration<double>(fleet_->options_.step_time).count();
      v1::WorkerMessage m;
      v1::StepReport* r = m.mutable_step();
      r->set_job_id(p.job_id());
      r->set_step(step);
      r->set_seconds(seconds);
      r->set_wait_seconds(seconds * 0.1);
      r->set_has_loss(p.rank() == p.num_ranks() - 1);
      r->set_loss(1.0 / static_cast<double>(step));
      r->set_learning_rate(0.1);
      r->set_peak_activation_bytes(1 << 20);
      r->set_peak_in_flight(1);
      r->set_grad_squared_sum(1.0);
      const int64_t start_us =
          NowUnixUs() - static_cast<int64_t>(seconds * 1e6);
      r->set_start_unix_us(start_us);
      // A span per action, evenly over the step: the timeline a real rank
      // reports, at its size.
      const int n = p.actions_size();
      const int64_t each_us =
          n == 0 ? 0 : static_cast<int64_t>(seconds * 1e6) / n;
      for (int i = 0; i < n; ++i) {
        const v1::Action& a = p.actions(i);
        v1::Span* span = r->add_spans();
        span->set_kind(a.op() == v1::FORWARD ? v1::Span::FORWARD
                                             : v1::Span::BACKWARD);
        span->set_stage(a.stage());
        span->set_microbatch(a.microbatch());
        span->set_start_us(i * each_us);
        span->set_duration_us(each_us);
        span->set_peer(-1);
      }
      out.push_back(std::move(m));
      const bool drained = job.stop_after > 0 && step >= job.stop_after;
      const int64_t every = fleet_->options_.checkpoint_every;
      if (!p.checkpoint_dir().empty() &&
          (drained || (every > 0 && step % every == 0))) {
        // The step directory a real rank's stage files create: the
        // coordinator writes its manifest there. The files themselves are
        // not written (their cost is the workers', not the coordinator's).
        std::error_code ignored;
        std::filesystem::create_directories(
            absl::StrCat(p.checkpoint_dir(), "/step-", step), ignored);
        v1::WorkerMessage c;
        v1::CheckpointSaved* saved = c.mutable_checkpoint();
        saved->set_job_id(p.job_id());
        saved->set_step(step);
        saved->set_seconds(0.01);
        for (const v1::StageProgram& s : p.stages()) {
          v1::StageFile* f = saved->add_files();
          f->set_stage(s.stage());
          f->set_file(absl::StrCat("stage-", s.stage(), ".safetensors"));
          f->set_bytes(4096);
          f->set_crc32c(static_cast<uint32_t>(s.stage()));
        }
        out.push_back(std::move(c));
        fleet_->checkpoints_.fetch_add(1);
      }
      if (drained) {
        v1::WorkerMessage e = Ended(p.job_id(), v1::CANCELLED,
                                    absl::StrCat("drained after step ", step));
        e.mutable_ended()->set_drained_after_step(step);
        out.push_back(std::move(e));
        job_.reset();
      } else if (step >= p.steps()) {
        out.push_back(Ended(p.job_id(), v1::SUCCEEDED, ""));
        job_.reset();
      } else {
        again = true;
      }
    }
    fleet_->steps_.fetch_add(1);
    if (out.size() > 1 && !again) fleet_->jobs_ended_.fetch_add(1);
    for (v1::WorkerMessage& m : out) Send(std::move(m));
    if (again) {
      fleet_->Schedule(
          {std::chrono::steady_clock::now() + fleet_->options_.step_time,
           index_, SimFleet::Event::kStep, generation});
    }
  }

  SimFleet* const fleet_;
  const int index_;
  v1::WorkerSession::Stub* const stub_;
  grpc::ClientContext context_;
  v1::CoordinatorMessage incoming_;

  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  bool writing_ = false;
  v1::WorkerMessage current_;
  std::deque<v1::WorkerMessage> out_;
  std::chrono::milliseconds heartbeat_interval_{1000};
  uint64_t generation_ = 0;
  std::optional<Job> job_;
};

SimFleet::SimFleet(SimFleetOptions options) : options_(std::move(options)) {
  const int per = std::max(1, options_.workers_per_connection);
  const int connections = (options_.workers + per - 1) / per;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    // A channel argument of its own per connection, and no shared
    // subchannel pool: each channel opens its own TCP connection.
    args.SetInt("conveyor.fleet_sim.connection", c);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(64 << 20);
    channels_.push_back(grpc::CreateCustomChannel(
        options_.coordinator, grpc::InsecureChannelCredentials(), args));
    stubs_.push_back(v1::WorkerSession::NewStub(channels_.back()));
  }
  // Every worker exists before any session starts: the timer thread and
  // gRPC's callbacks index workers_.
  workers_.reserve(options_.workers);
  for (int i = 0; i < options_.workers; ++i) {
    workers_.push_back(
        std::make_unique<SimWorker>(this, i, stubs_[i / per].get()));
  }
  timer_thread_ = std::thread([this] { RunTimers(); });
  for (auto& w : workers_) w->Start();
}

SimFleet::~SimFleet() {
  {
    std::lock_guard<std::mutex> lock(timers_mu_);
    stopping_ = true;
    timers_cv_.notify_all();
  }
  timer_thread_.join();
  for (auto& w : workers_) w->Cancel();
  for (auto& w : workers_) w->WaitDone();
}

SimFleet::Counters SimFleet::counters() const {
  return {heartbeats_.load(), steps_.load(), checkpoints_.load(),
          jobs_ended_.load()};
}

void SimFleet::Schedule(Timer timer) {
  std::lock_guard<std::mutex> lock(timers_mu_);
  if (stopping_) return;
  const bool sooner = timers_.empty() || timer.when < timers_.top().when;
  timers_.push(timer);
  if (sooner) timers_cv_.notify_one();
}

void SimFleet::RunTimers() {
  std::unique_lock<std::mutex> lock(timers_mu_);
  while (!stopping_) {
    if (timers_.empty()) {
      timers_cv_.wait(lock);
      continue;
    }
    const Timer next = timers_.top();
    if (std::chrono::steady_clock::now() < next.when) {
      timers_cv_.wait_until(lock, next.when);
      continue;
    }
    timers_.pop();
    lock.unlock();
    workers_[next.worker]->Fire(next.event, next.generation);
    lock.lock();
  }
}

}  // namespace conveyor::bench
