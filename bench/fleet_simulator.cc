// fleet_simulator: one real conveyor-coordinator and a simulated fleet
// (bench/fleet_sim_workers.h) on loopback, to measure what one coordinator
// holds (issue 40; docs/operations.md "Fleet scale" has a full run's
// figures against the targets). It:
//   1. starts the coordinator binary with a state file and /metrics in a
//      temporary directory, and --workers simulated workers;
//   2. submits --jobs small jobs through the real API, sized to fill all
//      but --big-stages workers, and waits until every one is RUNNING;
//   3. measures a steady window: the coordinator's CPU share and RSS
//      (/proc), its heartbeat handling time (the
//      conveyor_worker_message_handling_seconds histogram), the state
//      file's journal appends and compactions (and the time they take,
//      measured in the same directory), and /metrics' size and scrape
//      time;
//   4. submits one --big-stages job onto the idle workers: the SubmitJob
//      call places it (time to place) and then it runs (submit to RUNNING);
//   5. opens --watchers WatchJob streams and measures their cost.
// Prints a table (each figure against the target, judged only at
// the full size: 4,096 workers and 512 jobs) and, with --json, the figures.
// Exit 0 when it ran; 1 when it could not.

#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"  // flags
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/fleet_probe.h"        // the coordinator from outside
#include "bench/fleet_sim_workers.h"  // SimFleet
#include "conveyor/v1/conveyor.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace conveyor::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string coordinator_binary;
  int workers = 64;
  int jobs = 8;
  int big_stages = 8;
  int64_t steps = 100000;
  int step_ms = 1000;
  int64_t checkpoint_every = 10;
  double window_s = 10;
  int watchers = 64;
  int workers_per_connection = 16;
  int submit_threads = 4;
  double heartbeat_timeout_s = 10;
  std::string json;
};

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - 1);
  return v[q <= 0 ? 0 : i];
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A job of `stages` one-layer stages, one per worker.
std::string JobYaml(int index, int stages, int64_t steps,
                    const std::string& checkpoint_dir,
                    int64_t checkpoint_every) {
  std::string layers;
  for (int s = 0; s < stages; ++s) {
    if (s > 0) layers += "    - boundary\n";
    layers += "    - dense: {features: 4}\n";
  }
  const int microbatches = std::max(4, stages);
  std::string yaml = absl::StrCat(
      "name: fleet-", index,
      "\nmodel:\n  input_shape: [4]\n  init: {seed: 1}\n", "  layers:\n",
      layers, "  loss: mse\ndata: {source: synthetic-regression}\n",
      "training: {steps: ", steps, ", batch_size: ", 2 * microbatches,
      ", microbatches: ", microbatches, "}\n",
      "optimizer: {kind: sgd, lr: 0.1}\npipeline: {schedule: 1f1b}\n");
  if (!checkpoint_dir.empty()) {
    absl::StrAppend(&yaml, "checkpoint: {dir: ", checkpoint_dir,
                    ", every: ", checkpoint_every, ", keep_latest: 1}\n");
  }
  return yaml;
}

// WatchJob streams: each delivered step event's delay after the step was
// recorded (now - Job.last_step_unix_ms).
class Watchers {
 public:
  class Watch final : public grpc::ClientReadReactor<v1::JobEvent> {
   public:
    Watch(Watchers* owner, v1::Coordinator::Stub* stub, const std::string& id)
        : owner_(owner) {
      request_.set_id(id);
      stub->async()->WatchJob(&context_, &request_, this);
      StartRead(&event_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;
      owner_->events_.fetch_add(1);
      if (event_.has_step()) {
        owner_->Record(NowUnixMs() - event_.job().last_step_unix_ms());
      }
      StartRead(&event_);
    }
    void OnDone(const grpc::Status&) override {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      done_ = true;
      owner_->cv_.notify_all();
    }
    grpc::ClientContext context_;
    v1::WatchJobRequest request_;
    v1::JobEvent event_;
    Watchers* owner_;
    bool done_ = false;
  };

  ~Watchers() {
    for (auto& w : watches_) w->context_.TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& w : watches_) {
      cv_.wait(lock, [&] { return w->done_; });
    }
  }
  void Add(v1::Coordinator::Stub* stub, const std::string& id) {
    watches_.push_back(std::make_unique<Watch>(this, stub, id));
  }
  void Record(int64_t ms) {
    std::lock_guard<std::mutex> lock(mu_);
    delays_ms_.push_back(static_cast<double>(ms));
  }
  std::atomic<int64_t> events_{0};
  std::vector<double> TakeDelays() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(delays_ms_, {});
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<double> delays_ms_;
  std::vector<std::unique_ptr<Watch>> watches_;
};

// One row of the report: the figure, its value and the target.
struct Row {
  std::string figure;
  double value;
  std::string unit;
  double target;      // NaN: no target.
  bool below = true;  // The target is an upper bound.
};

class Report {
 public:
  explicit Report(bool judged) : judged_(judged) {}
  void Add(std::string figure, double value, std::string unit,
           double target = std::nan(""), bool below = true) {
    rows_.push_back({std::move(figure), value, std::move(unit), target, below});
  }
  void Print() const {
    std::printf("%-44s %14s  %-8s %12s  %s\n", "figure", "value", "unit",
                "target", "result");
    for (const Row& r : rows_) {
      std::string target = "", result = "";
      if (!std::isnan(r.target)) {
        target = absl::StrFormat("%s %g", r.below ? "<" : ">", r.target);
        const bool ok = r.below ? r.value < r.target : r.value > r.target;
        result = !judged_ ? "(full run only)" : ok ? "ok" : "OVER TARGET";
      }
      std::printf("%-44s %14.4g  %-8s %12s  %s\n", r.figure.c_str(), r.value,
                  r.unit.c_str(), target.c_str(), result.c_str());
    }
  }
  void WriteJson(const std::string& path, const Flags& f) const {
    std::ofstream out(path);
    out << "{\"workers\": " << f.workers << ", \"jobs\": " << f.jobs
        << ", \"figures\": {";
    for (size_t i = 0; i < rows_.size(); ++i) {
      const double v = rows_[i].value;
      out << (i ? ", " : "") << "\"" << rows_[i].figure
          << "\": " << (std::isnan(v) ? std::string("null") : absl::StrCat(v));
    }
    out << "}}\n";
  }

 private:
  bool judged_;
  std::vector<Row> rows_;
};

#define CHECK_OK_OR_EXIT(expr)                              \
  do {                                                      \
    if (!(expr)) {                                          \
      std::fprintf(stderr, "fleet_simulator: %s\n", #expr); \
      return 1;                                             \
    }                                                       \
  } while (0)

int Run(const Flags& f) {
  char tmpl[] = "/tmp/conveyor-fleet-XXXXXX";
  const char* made = mkdtemp(tmpl);
  if (made == nullptr) {
    std::fprintf(stderr, "fleet_simulator: cannot make a temporary dir\n");
    return 1;
  }
  const std::string dir = made;
  // Declared before the coordinator and the fleet, so it runs after they
  // are gone, on every return.
  absl::Cleanup remove_dir = [&dir] {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  };
  absl::StatusOr<std::unique_ptr<CoordinatorProcess>> started =
      CoordinatorProcess::Start(
          f.coordinator_binary, dir,
          {absl::StrCat("--heartbeat-timeout=", f.heartbeat_timeout_s)});
  if (!started.ok()) {
    std::fprintf(stderr, "fleet_simulator: %s\n",
                 std::string(started.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<CoordinatorProcess> coordinator = *std::move(started);
  std::printf("coordinator pid %d on %s, metrics on %s, files in %s\n",
              coordinator->pid(), coordinator->address().c_str(),
              coordinator->metrics_address().c_str(), dir.c_str());
  std::fflush(stdout);
  Report report(f.workers >= 4096 && f.jobs >= 512);
  StateFileWatcher state_watcher(coordinator->state_file());

  // 1. The fleet registers.
  const Clock::time_point fleet_start = Clock::now();
  auto fleet = std::make_unique<SimFleet>(
      SimFleetOptions{.coordinator = coordinator->address(),
                      .workers = f.workers,
                      .workers_per_connection = f.workers_per_connection,
                      .step_time = std::chrono::milliseconds(f.step_ms),
                      .checkpoint_every = f.checkpoint_every});
  while (fleet->registered() < f.workers) {
    if (Clock::now() - fleet_start > std::chrono::seconds(300) ||
        fleet->ended() > 0 || !coordinator->Alive()) {
      std::fprintf(stderr,
                   "fleet_simulator: %d of %d workers registered (%d "
                   "sessions ended)\n",
                   fleet->registered(), f.workers, fleet->ended());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  report.Add("registration of every worker",
             Seconds(Clock::now() - fleet_start), "s");
  std::fprintf(stderr, "%d workers registered; submitting %d jobs\n", f.workers,
               f.jobs);
  // What the sessions alone cost, before any job.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  if (absl::StatusOr<ProcStats> idle = ReadProcStats(coordinator->pid());
      idle.ok()) {
    report.Add("coordinator RSS, workers registered, no job",
               idle->rss_bytes / 1048576.0, "MiB");
    report.Add("coordinator threads, no job",
               static_cast<double>(idle->threads), "");
  }

  // 2. The jobs, filling all but big_stages workers.
  auto channel = grpc::CreateChannel(coordinator->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Coordinator::NewStub(channel);
  const int capacity = f.workers - f.big_stages;
  if (capacity < f.jobs) {
    std::fprintf(stderr,
                 "fleet_simulator: --jobs %d needs at least %d workers "
                 "besides the %d of --big-stages (--workers %d)\n",
                 f.jobs, f.jobs, f.big_stages, f.workers);
    return 1;
  }
  std::vector<double> submit_ms;
  std::vector<std::string> ids(static_cast<size_t>(f.jobs));
  std::mutex submit_mu;
  std::string submit_error;
  const Clock::time_point submit_start = Clock::now();
  // Several clients at once, as several teams would submit.
  auto submit_some = [&](int first) {
    for (int j = first; j < f.jobs; j += f.submit_threads) {
      const int stages = capacity / f.jobs + (j < capacity % f.jobs ? 1 : 0);
      v1::SubmitJobRequest request;
      request.set_yaml(
          JobYaml(j, stages, f.steps,
                  f.checkpoint_every > 0 ? absl::StrCat(dir, "/ckpt/", j) : "",
                  f.checkpoint_every));
      request.set_file_name(absl::StrCat("fleet-", j, ".yaml"));
      request.set_base_dir(dir);
      grpc::ClientContext context;
      v1::SubmitJobResponse response;
      const Clock::time_point t = Clock::now();
      grpc::Status s = stub->SubmitJob(&context, request, &response);
      std::lock_guard<std::mutex> lock(submit_mu);
      submit_ms.push_back(Seconds(Clock::now() - t) * 1e3);
      if (!s.ok()) {
        submit_error = absl::StrCat("job ", j, ": ", s.error_message());
        return;
      }
      ids[static_cast<size_t>(j)] = response.job().id();
    }
  };
  {
    std::vector<std::thread> submitters;
    for (int t = 0; t < f.submit_threads; ++t) {
      submitters.emplace_back(submit_some, t);
    }
    for (std::thread& t : submitters) t.join();
  }
  if (!submit_error.empty()) {
    std::fprintf(stderr, "fleet_simulator: %s\n", submit_error.c_str());
    return 1;
  }
  report.Add("SubmitJob p50 (placed within the call)",
             Percentile(submit_ms, 0.5), "ms");
  report.Add("SubmitJob p99", Percentile(submit_ms, 0.99), "ms");
  const Clock::time_point submitted = Clock::now();
  std::vector<double> to_running_ms;
  while (true) {
    grpc::ClientContext context;
    v1::ListJobsResponse list;
    CHECK_OK_OR_EXIT(stub->ListJobs(&context, {}, &list).ok());
    int running = 0;
    to_running_ms.clear();
    for (const v1::Job& job : list.jobs()) {
      if (job.state() == v1::FAILED) {
        std::fprintf(stderr, "fleet_simulator: %s failed: %s\n",
                     job.id().c_str(), job.message().c_str());
        return 1;
      }
      if (job.state() == v1::RUNNING) {
        ++running;
        to_running_ms.push_back(
            static_cast<double>(job.started_unix_ms() - job.created_unix_ms()));
      }
    }
    if (running == f.jobs) break;
    CHECK_OK_OR_EXIT(Clock::now() - submitted < std::chrono::seconds(1800));
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  std::fprintf(stderr, "every job RUNNING; measuring %.0f s\n", f.window_s);
  report.Add("all jobs submitted and RUNNING",
             Seconds(Clock::now() - submit_start), "s");
  report.Add("submit to RUNNING p50 (burst)", Percentile(to_running_ms, 0.5),
             "ms");
  report.Add("submit to RUNNING p99 (burst)", Percentile(to_running_ms, 0.99),
             "ms");

  // Steps every rank of a job has reported, summed over the jobs.
  auto steps_done = [&]() -> int64_t {
    grpc::ClientContext context;
    v1::ListJobsResponse list;
    if (!stub->ListJobs(&context, {}, &list).ok()) return -1;
    int64_t n = 0;
    for (const v1::Job& job : list.jobs()) n += job.steps_done();
    return n;
  };

  // 3. The steady window.
  auto scrape = [&](double* ms) -> std::string {
    const Clock::time_point t = Clock::now();
    absl::StatusOr<std::string> text =
        HttpGet(coordinator->metrics_address(), "/metrics");
    if (ms != nullptr) *ms = Seconds(Clock::now() - t) * 1e3;
    return text.ok() ? *text : "";
  };
  const std::string kHandling = "conveyor_worker_message_handling_seconds";
  std::this_thread::sleep_for(std::chrono::seconds(2));  // Steps under way.
  const std::string m0 = scrape(nullptr);
  absl::StatusOr<ProcStats> p0 = ReadProcStats(coordinator->pid());
  const StateFileWatcher::Seen s0 = state_watcher.seen();
  const SimFleet::Counters c0 = fleet->counters();
  const int64_t d0 = steps_done();
  const Clock::time_point w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(f.window_s));
  const double window = Seconds(Clock::now() - w0);
  absl::StatusOr<ProcStats> p1 = ReadProcStats(coordinator->pid());
  const StateFileWatcher::Seen s1 = state_watcher.seen();
  const SimFleet::Counters c1 = fleet->counters();
  const int64_t d1 = steps_done();
  const std::string m1 = scrape(nullptr);
  CHECK_OK_OR_EXIT(p0.ok() && p1.ok());
  const double cpu_share = (p1->cpu_seconds - p0->cpu_seconds) / window;
  report.Add("coordinator CPU (steady)", cpu_share, "cores", 1.0);
  report.Add("coordinator RSS", p1->rss_bytes / 1048576.0, "MiB", 1024);
  report.Add("coordinator threads", static_cast<double>(p1->threads), "");
  report.Add("heartbeats handled", (c1.heartbeats - c0.heartbeats) / window,
             "/s");
  report.Add("step reports sent", (c1.steps - c0.steps) / window, "/s");
  report.Add("job steps completed (coordinator)", (d1 - d0) / window, "/s");
  const Buckets hb0 = ParseBuckets(m0, kHandling, "kind=\"heartbeat\"");
  const Buckets hb1 = ParseBuckets(m1, kHandling, "kind=\"heartbeat\"");
  report.Add("heartbeat handling p50", QuantileBetween(hb0, hb1, 0.5) * 1e3,
             "ms");
  report.Add("heartbeat handling p99", QuantileBetween(hb0, hb1, 0.99) * 1e3,
             "ms", 10);
  report.Add("heartbeats handled within 10 ms",
             FractionAtOrBelow(hb0, hb1, 0.01), "fraction", 0.99, false);
  const Buckets st0 = ParseBuckets(m0, kHandling, "kind=\"step\"");
  const Buckets st1 = ParseBuckets(m1, kHandling, "kind=\"step\"");
  report.Add("step report handling p99", QuantileBetween(st0, st1, 0.99) * 1e3,
             "ms");
  // Persistence since the journal: most writes are journal appends (one
  // fdatasync'd record of the jobs that changed), and a compaction (a whole
  // snapshot, fsync'd and renamed, then an empty journal the same way) once
  // the journal outgrows the snapshot. Its share of a core is estimated as
  // the time those writes take, measured here in the same directory: the
  // appends seen times one fdatasync'd append of their mean size, plus the
  // compactions seen times a modelled snapshot write and journal header
  // write. The writes are serialized (JobStore's persist_mu_), so this is
  // also the share of time one writer is busy; it is the writes' time, not
  // the CPU the coordinator spends encoding the changes, which is part of
  // its CPU share above.
  const double appends = (s1.appends - s0.appends) / window;
  const double appended = (s1.appended_bytes - s0.appended_bytes) / window;
  const double compactions = (s1.compactions - s0.compactions) / window;
  const double compacted = (s1.compacted_bytes - s0.compacted_bytes) / window;
  const int64_t mean_record =
      s1.appends > s0.appends
          ? (s1.appended_bytes - s0.appended_bytes) / (s1.appends - s0.appends)
          : 0;
  report.Add("state snapshot size", s1.snapshot_size / 1024.0, "KiB");
  report.Add("state journal size (now)", s1.journal_size / 1024.0, "KiB");
  report.Add("journal appends seen", appends, "/s");
  report.Add("journal record, mean", static_cast<double>(mean_record), "B");
  report.Add("journal bytes appended", appended / 1024.0, "KiB/s");
  report.Add("compactions seen (new snapshots)", compactions, "/s");
  report.Add("snapshot bytes written", compacted / 1024.0, "KiB/s");
  report.Add("coordinator write_bytes (/proc io)",
             (p1->write_bytes - p0->write_bytes) / window / 1024.0, "KiB/s");
  absl::StatusOr<double> append_s =
      TimeDurableAppend(dir, std::max<int64_t>(mean_record, 1), 50);
  absl::StatusOr<double> snapshot_s =
      TimeDurableWrite(dir, s1.snapshot_size, 5);
  absl::StatusOr<double> header_s = TimeDurableWrite(dir, 20, 5);
  const bool timed = append_s.ok() && snapshot_s.ok() && header_s.ok();
  report.Add("one journal append (fdatasync'd, measured)",
             append_s.ok() ? *append_s * 1e3 : std::nan(""), "ms");
  report.Add("one compaction (fsync'd, modelled)",
             timed ? (*snapshot_s + *header_s) * 1e3 : std::nan(""), "ms");
  report.Add("state persistence (appends + compactions)",
             timed
                 ? appends * *append_s + compactions * (*snapshot_s + *header_s)
                 : std::nan(""),
             "cores", 0.05);

  std::vector<double> scrape_ms;
  size_t metrics_bytes = 0;
  for (int i = 0; i < 5; ++i) {
    double ms = 0;
    metrics_bytes = scrape(&ms).size();
    scrape_ms.push_back(ms);
  }
  report.Add("/metrics size", metrics_bytes / 1e6, "MB", 2.0);
  report.Add("/metrics scrape time (median of 5)", Percentile(scrape_ms, 0.5),
             "ms", 200);

  std::fprintf(stderr, "placing the %d-stage job\n", f.big_stages);
  // 4. The big job onto the idle workers.
  {
    v1::SubmitJobRequest request;
    request.set_yaml(JobYaml(f.jobs, f.big_stages, f.steps, "", 0));
    request.set_file_name("fleet-big.yaml");
    grpc::ClientContext context;
    v1::SubmitJobResponse response;
    const Clock::time_point t = Clock::now();
    grpc::Status s = stub->SubmitJob(&context, request, &response);
    const double place_ms = Seconds(Clock::now() - t) * 1e3;
    if (!s.ok()) {
      std::fprintf(stderr, "fleet_simulator: the big job: %s\n",
                   s.error_message().c_str());
      return 1;
    }
    // SubmitJob places the job before it answers (with the job as it was
    // queued): placed within the call when it is PLANNING now.
    v1::Job now;
    {
      grpc::ClientContext c2;
      v1::GetJobRequest get;
      get.set_id(response.job().id());
      CHECK_OK_OR_EXIT(stub->GetJob(&c2, get, &now).ok());
    }
    const bool placed = now.state() != v1::QUEUED;
    report.Add(absl::StrCat("place a ", f.big_stages, "-stage job (SubmitJob)"),
               placed ? place_ms : std::nan(""), "ms", 50);
    const std::string id = response.job().id();
    while (true) {
      grpc::ClientContext c2;
      v1::GetJobRequest get;
      get.set_id(id);
      v1::Job job;
      CHECK_OK_OR_EXIT(stub->GetJob(&c2, get, &job).ok());
      CHECK_OK_OR_EXIT(job.state() != v1::FAILED);
      if (job.state() == v1::RUNNING) {
        report.Add(
            absl::StrCat(f.big_stages, "-stage job submit to RUNNING"),
            static_cast<double>(job.started_unix_ms() - job.created_unix_ms()),
            "ms");
        break;
      }
      CHECK_OK_OR_EXIT(Clock::now() - t < std::chrono::seconds(120));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // 5. WatchJob fan-out.
  if (f.watchers > 0) {
    std::fprintf(stderr, "%d watchers\n", f.watchers);
    Watchers watchers;
    for (int i = 0; i < f.watchers; ++i) {
      watchers.Add(stub.get(), ids[static_cast<size_t>(i) % ids.size()]);
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));
    watchers.TakeDelays();
    absl::StatusOr<ProcStats> q0 = ReadProcStats(coordinator->pid());
    const Clock::time_point v0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(f.window_s));
    const double watched = Seconds(Clock::now() - v0);
    absl::StatusOr<ProcStats> q1 = ReadProcStats(coordinator->pid());
    std::vector<double> delays = watchers.TakeDelays();
    CHECK_OK_OR_EXIT(q0.ok() && q1.ok());
    const double share = (q1->cpu_seconds - q0->cpu_seconds) / watched;
    const double events = delays.size() / watched;
    report.Add(absl::StrCat("WatchJob streams open"), f.watchers, "");
    report.Add("watch step events delivered", events, "/s");
    report.Add("watch events (all, whole run)", watchers.events_.load(), "");
    report.Add("coordinator CPU with watchers", share, "cores", 1.0);
    report.Add("CPU per delivered event (vs steady)",
               events > 0 ? (share - cpu_share) / events * 1e6 : std::nan(""),
               "us");
    report.Add("watch event delay p50", Percentile(delays, 0.5), "ms");
    report.Add("watch event delay p99", Percentile(delays, 0.99), "ms");
  }
  absl::StatusOr<ProcStats> last = ReadProcStats(coordinator->pid());
  if (last.ok()) {
    report.Add("coordinator peak RSS", last->peak_rss_bytes / 1048576.0, "MiB",
               1024);
  }
  struct rusage self {};
  getrusage(RUSAGE_SELF, &self);
  report.Add("simulator's own CPU (whole run)",
             self.ru_utime.tv_sec + self.ru_stime.tv_sec +
                 (self.ru_utime.tv_usec + self.ru_stime.tv_usec) / 1e6,
             "s");
  std::printf(
      "\n== fleet: %d simulated workers, %d jobs (+1 of %d stages), "
      "steps of %d ms, checkpoint every %lld steps\n",
      f.workers, f.jobs, f.big_stages, f.step_ms,
      static_cast<long long>(f.checkpoint_every));
  report.Print();
  std::printf(
      "state persistence: journal appends/s x one fdatasync'd append of "
      "their mean size, plus compactions/s x one snapshot and journal "
      "header written by temporary file, fsync and rename, both timed "
      "after the window in the state file's directory: the writes' time "
      "(one writer at a time), not the CPU of encoding the records "
      "(docs/operations.md \"Fleet scale\")\n");
  if (!f.json.empty()) report.WriteJson(f.json, f);
  return 0;
}

}  // namespace
}  // namespace conveyor::bench

int main(int argc, char** argv) {
  conveyor::bench::Flags f;
  CLI::App app{"fleet_simulator: a real coordinator and a simulated fleet"};
  {
    // Next to this binary's build tree: build/bench/.. -> build/bin.
    char self[4096] = {0};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    std::string path = n > 0 ? std::string(self, static_cast<size_t>(n)) : "";
    path = path.substr(0, path.rfind('/'));
    f.coordinator_binary = path + "/../bin/conveyor-coordinator";
  }
  app.add_option("--coordinator-binary", f.coordinator_binary)
      ->capture_default_str();
  app.add_option("--workers", f.workers)->check(CLI::Range(2, 65536));
  app.add_option("--jobs", f.jobs)->check(CLI::Range(1, 65536));
  app.add_option("--big-stages", f.big_stages, "Stages of the placement probe")
      ->check(CLI::Range(1, 1024));
  app.add_option("--steps", f.steps)->check(CLI::PositiveNumber);
  app.add_option("--step-ms", f.step_ms)->check(CLI::Range(1, 600000));
  app.add_option("--checkpoint-every", f.checkpoint_every, "0: no checkpoints")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--window-s", f.window_s)->check(CLI::PositiveNumber);
  app.add_option("--watchers", f.watchers)->check(CLI::Range(0, 4096));
  app.add_option("--workers-per-connection", f.workers_per_connection)
      ->check(CLI::Range(1, 65536));
  app.add_option("--submit-threads", f.submit_threads,
                 "Clients submitting the jobs at once")
      ->check(CLI::Range(1, 64));
  app.add_option("--heartbeat-timeout", f.heartbeat_timeout_s)
      ->check(CLI::PositiveNumber);
  app.add_option("--json", f.json, "Write the figures here");
  CLI11_PARSE(app, argc, argv);
  return conveyor::bench::Run(f);
}
