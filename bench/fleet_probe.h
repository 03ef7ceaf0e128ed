// What the fleet simulator (bench/fleet_simulator.cc) observes of the real
// coordinator from outside: the daemon as a child process, its CPU time,
// memory and I/O from /proc, its /metrics over HTTP (with the quantiles of
// a histogram between two scrapes), and its state file's journal appends
// and compactions.
//
// Thread-compatible, except StateFileWatcher, which polls on its own thread.
#ifndef CONVEYOR_BENCH_FLEET_PROBE_H_
#define CONVEYOR_BENCH_FLEET_PROBE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor::bench {

// The conveyor-coordinator binary, started on loopback with a state file and
// a metrics port in `dir`; SIGTERM and a wait on destruction.
class CoordinatorProcess {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorProcess>> Start(
      const std::string& binary, const std::string& dir,
      const std::vector<std::string>& extra_args);
  ~CoordinatorProcess();

  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& state_file() const { return state_file_; }
  // False once the process has exited (it should not, during a run).
  bool Alive() const;

 private:
  CoordinatorProcess() = default;
  pid_t pid_ = -1;
  std::string address_;
  std::string metrics_address_;
  std::string state_file_;
};

// /proc/<pid>/{stat,status,io}.
struct ProcStats {
  double cpu_seconds = 0;      // utime + stime.
  int64_t rss_bytes = 0;       // VmRSS.
  int64_t peak_rss_bytes = 0;  // VmHWM.
  int64_t threads = 0;
  int64_t write_bytes = 0;  // Sent to the storage layer (io: write_bytes).
  int64_t wchar = 0;        // Every write(2), sockets included.
};
absl::StatusOr<ProcStats> ReadProcStats(pid_t pid);

// GET http://<host:port><path> (HTTP/1.0); the body. Unavailable when the
// server cannot be reached; Internal for a status other than 200.
absl::StatusOr<std::string> HttpGet(const std::string& host_port,
                                    const std::string& path);

// A histogram's cumulative buckets as one scrape showed them (the series
// whose labels contain `label`, e.g. kind="heartbeat").
struct Buckets {
  std::map<double, double> cumulative;  // le -> count (+Inf as infinity).
  double count() const;
};
Buckets ParseBuckets(const std::string& metrics_text, const std::string& name,
                     const std::string& label);
// The observations made between `before` and `after`: the q-quantile by
// linear interpolation within its bucket (Prometheus' histogram_quantile),
// and the fraction at or below `bound` (exact when `bound` is a bucket's
// le). NaN when nothing was observed.
double QuantileBetween(const Buckets& before, const Buckets& after, double q);
double FractionAtOrBelow(const Buckets& before, const Buckets& after,
                         double bound);

// Polls the coordinator's state file (every 10 ms) as it is written since
// the journal (coordinator/state_file.h): a snapshot at `path` and a
// journal at "<path>.journal". A journal record is an append (counted
// exactly: the watcher keeps the journal open and reads each new record's
// frame, and reads a replaced journal to its end before it moves on, so
// that no record is missed however many come between two polls); a new
// snapshot inode is a compaction (or a Save), which also replaces the
// journal with an empty one.
class StateFileWatcher {
 public:
  explicit StateFileWatcher(std::string path);
  ~StateFileWatcher();
  struct Seen {
    int64_t appends = 0;          // Journal records.
    int64_t appended_bytes = 0;   // Their frames (header and payload).
    int64_t compactions = 0;      // New snapshot inodes.
    int64_t compacted_bytes = 0;  // Sizes of the new snapshots.
    int64_t snapshot_size = 0;    // Now.
    int64_t journal_size = 0;     // Now.
  };
  Seen seen() const;

 private:
  void Run();
  // Reads the journal open as journal_fd_ from journal_offset_ to its end
  // and counts the whole records in it.
  void DrainJournal();
  const std::string path_;
  const std::string journal_path_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> appends_{0};
  std::atomic<int64_t> appended_bytes_{0};
  std::atomic<int64_t> compactions_{0};
  std::atomic<int64_t> compacted_bytes_{0};
  std::atomic<int64_t> snapshot_size_{0};
  std::atomic<int64_t> journal_size_{0};
  // The watcher thread's own.
  int journal_fd_ = -1;
  int64_t journal_offset_ = 0;  // Read up to here.
  std::string pending_;         // A record read in part.
  std::thread thread_;
};

// Seconds one write of `bytes` takes the way a snapshot is written
// (a temporary file, fsync, rename, fsync of the directory), in `dir`; the
// median of `repeats`.
absl::StatusOr<double> TimeDurableWrite(const std::string& dir, int64_t bytes,
                                        int repeats);

// Seconds one append of `bytes` takes the way a journal record is written
// (pwrite at the end of an open file, fdatasync), in `dir`; the median of
// `repeats` appends to one growing file.
absl::StatusOr<double> TimeDurableAppend(const std::string& dir, int64_t bytes,
                                         int repeats);

}  // namespace conveyor::bench

#endif  // CONVEYOR_BENCH_FLEET_PROBE_H_
