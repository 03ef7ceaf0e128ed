// MappedFile: a regular file mapped read-only into memory (mmap, MAP_SHARED),
// so that a data set larger than RAM costs page cache rather than the
// process's own memory: pages are read on first touch and the kernel may drop
// them again under pressure, since it can always re-read them from the file.
//
// Refuses what cannot be mapped safely: directories, FIFOs, devices and
// sockets (InvalidArgument "<path>: not a regular file", without blocking on
// a FIFO) and empty files (InvalidArgument "<path>: empty file"); the
// errno-derived code with the path and the call for anything the system
// refuses.
//
// A mapped file that shrinks turns a read of its lost tail into SIGBUS, which
// would take the daemon down. Readers therefore copy bytes out with CopyOut,
// which catches that SIGBUS and returns DataLoss instead; CheckNotShrunk
// before a gather turns the common case (a file rewritten in place while a
// job runs) into a clear error first.
//
// Thread-safe: immutable after Open but for an atomic counter; Advise and
// Release only give the kernel hints.
#ifndef CONVEYOR_COMMON_MAPPED_FILE_H_
#define CONVEYOR_COMMON_MAPPED_FILE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file.h"

namespace conveyor {

class MappedFile {
 public:
  // How the mapping will be read, for the kernel's read-ahead (madvise).
  enum class Access {
    kNormal,      // The default read-ahead.
    kSequential,  // Front to back: read ahead aggressively.
    kRandom,      // Scattered small reads: no read-ahead.
  };

  // Maps the whole regular file at `path`. Errors as above.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  // The size when mapped; never 0.
  uint64_t size() const { return size_; }

  // Copies [offset, offset + size) of the mapping into `out`. DataLoss
  // "<path>: ... lost while being read" when the file shrank under the copy
  // (the SIGBUS of a lost page is caught, on this thread, for the copy's
  // duration; any other SIGBUS keeps its previous disposition).
  // InvalidArgument for a range outside size().
  absl::Status CopyOut(uint64_t offset, uint64_t size, void* out) const;

  // Best effort: a failed madvise only costs speed.
  void Advise(Access access) const;

  // Drops this process's pages of [offset, offset + length) (rounded inward
  // to whole pages): after a one-off scan they would otherwise count in the
  // process's resident set until the kernel reclaims them. The page cache
  // keeps them, and a later read maps them again. Best effort.
  void Release(uint64_t offset, uint64_t length) const;

  // Counts `bytes` read through the mapping and, each time the count passes
  // `period`, releases the whole mapping (Release(0, size())). A reader
  // that visits a file far larger than RAM thus keeps its resident set near
  // `period` instead of growing towards the file's size: the pages stay in
  // the page cache, and a concurrent reader only faults them in again.
  void ReleaseEvery(uint64_t bytes, uint64_t period) const;

  // OK while the file still holds at least size() bytes; FailedPrecondition
  // "<path>: the file shrank from X to Y bytes while in use" otherwise, or the
  // errno-derived code if fstat fails.
  absl::Status CheckNotShrunk() const;

 private:
  MappedFile(std::string path, ScopedFd fd, const uint8_t* data, uint64_t size)
      : path_(std::move(path)), fd_(std::move(fd)), data_(data), size_(size) {}

  const std::string path_;
  // Kept open so that CheckNotShrunk sees the mapped file even after it is
  // renamed or replaced.
  const ScopedFd fd_;
  const uint8_t* const data_;
  const uint64_t size_;
  // Bytes read since the last release (ReleaseEvery).
  mutable std::atomic<uint64_t> unreleased_{0};
};

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_MAPPED_FILE_H_
