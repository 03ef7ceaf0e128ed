// StateFile: the coordinator's job records on disk (--state-file), so that
// they survive a restart of the coordinator.
//
// One file, rewritten whole with WriteFileAtomically (temporary file, fsync,
// rename, fsync of the directory): a crash leaves the previous version or the
// new one, never a mix. The serialized v1::CoordinatorState is framed as
//
//   0  u8[4] magic "CVYS"   4  u32 format (1)   8  u32 CRC-32C of the payload
//   12 u64 payload bytes    20 payload
//
// (little-endian), so a truncated, corrupted or foreign file is refused with
// DataLoss rather than read as an empty or partial state.
//
// The file is guarded by an exclusive flock on "<path>.lock", held while the
// StateFile lives: two coordinators given the same state file would each
// overwrite the other's jobs, so the second one is refused at start.
#ifndef CONVEYOR_COORDINATOR_STATE_FILE_H_
#define CONVEYOR_COORDINATOR_STATE_FILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

inline constexpr uint32_t kStateFileFormat = 1;
// A state file larger than this is refused rather than read into memory
// (the records it holds are bounded by max_finished_jobs and the queue).
inline constexpr uint64_t kMaxStateFileBytes = uint64_t{1} << 30;

// The framed bytes of `state`, and back. Decode: DataLoss naming what is
// wrong (magic, checksum, length, protobuf), FailedPrecondition for a format
// newer than this release reads.
std::string EncodeState(const v1::CoordinatorState& state);
absl::StatusOr<v1::CoordinatorState> DecodeState(absl::string_view bytes);

class StateFile {
 public:
  // Locks `path` for this process. FailedPrecondition when another process
  // holds it; errno errors for an unusable directory.
  static absl::StatusOr<std::unique_ptr<StateFile>> Open(
      const std::string& path);
  ~StateFile();

  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  // The saved state; nullopt when there is no file yet (a first start).
  // Errors name the path: DataLoss for a corrupt file, as DecodeState.
  absl::StatusOr<std::optional<v1::CoordinatorState>> Load() const;
  // Replaces the file with `state`, durably once this returns.
  absl::Status Save(const v1::CoordinatorState& state) const;

  const std::string& path() const { return path_; }

 private:
  StateFile(std::string path, int lock_fd)
      : path_(std::move(path)), lock_fd_(lock_fd) {}

  const std::string path_;
  const int lock_fd_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_STATE_FILE_H_
