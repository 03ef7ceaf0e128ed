// StateFile: the coordinator's job records on disk (--state-file), so that
// they survive a restart of the coordinator.
//
// Two files: a snapshot of every record at `path`, and a journal of the
// changes since at "<path>.journal" (coordinator/state_journal.h). A write
// (Append) adds one journal record holding only the records that changed,
// made durable (fdatasync) before it returns, so its cost does not grow with
// the number of jobs. Once the journal outgrows the snapshot
// (StateFileOptions), the next write compacts: a new snapshot of every
// record, then an empty journal, each written whole by WriteFileAtomically
// (temporary file, fsync, rename, fsync of the directory).
//
// The snapshot is framed as
//
//   0  u8[4] magic "CVYS"   4  u32 format (2)   8  u32 CRC-32C of bytes
//   20.. (generation and payload)   12 u64 payload bytes
//   20 u64 generation       28 payload (a serialized v1::CoordinatorState)
//
// (little-endian; format 1, written by earlier releases, has no generation
// and its payload at 20, and is read as generation 0). Each compaction
// writes the next generation, and a journal is replayed only onto the
// snapshot of its own generation: a crash between the snapshot's rename and
// the journal's leaves a journal of the previous generation, whose records
// the new snapshot already holds, and it is ignored. A crash at any point
// leaves the records as some write, or the write under way, left them: a
// prefix of the acknowledged changes, never a mix.
//
// A truncated, corrupted or foreign snapshot or journal header is refused
// with DataLoss rather than read as an empty or partial state; a journal's
// torn last record (a write a crash cut short, never acknowledged) is
// dropped, and cut off the file before the next append.
//
// The file is guarded by an exclusive flock on "<path>.lock", held while the
// StateFile lives: two coordinators given the same state file would each
// overwrite the other's jobs, so the second one is refused at start.
//
// Thread-safe (one mutex): Load, Save and Append may be called from any
// thread, one at a time.
#ifndef CONVEYOR_COORDINATOR_STATE_FILE_H_
#define CONVEYOR_COORDINATOR_STATE_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/state_journal.h"

namespace conveyor::coordinator {

inline constexpr uint32_t kStateFileFormat = 2;
// A state file or journal larger than this is refused rather than read into
// memory (the records they hold are bounded by max_finished_jobs and the
// queue; the journal is compacted long before).
inline constexpr uint64_t kMaxStateFileBytes = uint64_t{1} << 30;

// The framed bytes of `state` as snapshot `generation`, and back (either
// format). Decode: DataLoss naming what is wrong (magic, checksum, length,
// protobuf), FailedPrecondition for a format newer than this release reads.
std::string EncodeState(const v1::CoordinatorState& state,
                        uint64_t generation = 1);
struct DecodedState {
  v1::CoordinatorState state;
  uint64_t generation = 0;
};
absl::StatusOr<DecodedState> DecodeSnapshot(absl::string_view bytes);
absl::StatusOr<v1::CoordinatorState> DecodeState(absl::string_view bytes);

struct StateFileOptions {
  // A write compacts instead of appending once the journal would exceed
  // compact_ratio times the snapshot, and at least min_journal_bytes: each
  // record is then written about 1 + 1/compact_ratio times on average
  // (once in the journal, then its share of a snapshot), whatever the
  // number of jobs.
  uint64_t compact_ratio = 4;
  uint64_t min_journal_bytes = uint64_t{256} << 10;
  // Tests: called before each step of a write: "append" (a journal
  // record), "compact-snapshot" (the new snapshot), "compact-journal" (the
  // new, empty journal, after the snapshot's rename) and "compact-reopen"
  // (after both). An error stops the write there, leaving the files as a
  // crash at that point would.
  std::function<absl::Status(absl::string_view step)> TEST_fault{};
};

class StateFile {
 public:
  // What has been written since Open.
  struct Stats {
    uint64_t appends = 0;      // Journal records.
    uint64_t compactions = 0;  // Snapshots (Save's included).
    uint64_t bytes = 0;        // Of both.
  };

  // Locks `path` for this process. FailedPrecondition when another process
  // holds it; errno errors for an unusable directory.
  static absl::StatusOr<std::unique_ptr<StateFile>> Open(
      const std::string& path, StateFileOptions options = {});
  ~StateFile();

  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  // The saved state (the snapshot with its journal replayed); nullopt when
  // there is no file yet (a first start). Errors name the path: DataLoss
  // for a corrupt snapshot or journal, a journal without its snapshot or of
  // a later generation than it, records that contradict each other (a job
  // id twice, or not "job-<n>"); InvalidArgument for a directory, FIFO or
  // other non-file at either path. Cuts a torn journal tail off the file.
  absl::StatusOr<std::optional<v1::CoordinatorState>> Load();
  // Replaces every record with `state` (a new snapshot and an empty
  // journal), durably once this returns.
  absl::Status Save(const v1::CoordinatorState& state);
  // Applies one write's changes: the records in `changed` replace those of
  // the same id, the jobs numbered in `removed` are forgotten, and
  // `changed`'s next_job, version and queue order (the whole queue, always)
  // replace the saved ones (next_job never goes backwards). Durable once
  // this returns. After an error the next write compacts (the journal may
  // end in a torn record), and holds these changes too.
  absl::Status Append(const v1::CoordinatorState& changed,
                      const std::vector<uint64_t>& removed);

  Stats stats() const;
  const std::string& path() const { return path_; }
  const std::string& journal_path() const { return journal_path_; }

 private:
  // What the files hold (or will, once the write under way succeeds).
  struct Records {
    std::string version;
    uint64_t next_job = 0;
    std::map<uint64_t, v1::JobRecordState> jobs;
    std::vector<uint64_t> queue;
    v1::CoordinatorState ToState() const;
  };
  // A file as it was when this StateFile last wrote or read it: a file
  // replaced behind its back (deleted, moved, a directory made there) is
  // written anew rather than appended to. More than the inode, which a new
  // file may reuse at once.
  struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileId&) const = default;
  };
  // `path`'s FileId (or, given `fd`, that of the file it has open); nullopt
  // for anything but a regular file, or nothing.
  static std::optional<FileId> IdOf(const std::string& path, int fd = -1);

  StateFile(std::string path, int lock_fd, StateFileOptions options);

  absl::Status LoadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LoadJournalLocked(uint64_t snapshot_generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyLocked(const StateChanges& changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes records_ as the next generation's snapshot and an empty journal.
  absl::Status CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the next write must compact rather than append `record_bytes`.
  bool MustCompactLocked(uint64_t record_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Fault(absl::string_view step) const;
  void CloseJournalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const std::string journal_path_;
  const int lock_fd_;
  const StateFileOptions options_;

  mutable Mutex mu_;
  // Whether records_ holds what the files hold (Load ran, or a write).
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  // A write failed: the files may lag records_ or end torn.
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  Records records_ ABSL_GUARDED_BY(mu_);
  // Whether Load found a snapshot (false: a first start).
  bool has_snapshot_ ABSL_GUARDED_BY(mu_) = false;
  // The newest generation written or read (0: none, or format 1).
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t snapshot_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<FileId> snapshot_id_ ABSL_GUARDED_BY(mu_);
  // The journal of generation_, open for appends (-1: none yet).
  int journal_fd_ ABSL_GUARDED_BY(mu_) = -1;
  std::optional<FileId> journal_id_ ABSL_GUARDED_BY(mu_);
  uint64_t journal_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_STATE_FILE_H_
