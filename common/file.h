// Reading and atomically writing whole files, with errors that say what went
// wrong where: the errno-derived code (NotFound, PermissionDenied, ...) with
// the path and the failed call, InvalidArgument for something that is not a
// regular file or is over the caller's size limit, ResourceExhausted when
// memory runs out. Thread-safe.
#ifndef CONVEYOR_COMMON_FILE_H_
#define CONVEYOR_COMMON_FILE_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor {

// absl::ErrnoToStatus(err, "<path>: <operation>").
absl::Status ErrnoError(int err, absl::string_view path,
                        absl::string_view operation);

// An open file descriptor, closed when this goes.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  ScopedFd& operator=(ScopedFd&&) = delete;
  ~ScopedFd();
  int get() const { return fd_; }

 private:
  int fd_;
};

// The regular file at `path`, open for reading, and its size when opened.
// Never blocks: a FIFO would otherwise wait in open() for a writer that may
// never come (a job naming one wedged a worker). The errno-derived code
// with the path and the failed call, or InvalidArgument "<path>: not a
// regular file" for a directory, FIFO, device or socket.
struct RegularFile {
  ScopedFd fd;
  uint64_t size = 0;
};
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path);

// OK when `path` is a directory (following links). NotFound
// "<path>: no such <what>" when nothing is there, FailedPrecondition
// "<path>: not a directory" for anything else, the errno-derived code when
// it cannot be examined.
absl::Status CheckDirectory(const std::string& path, absl::string_view what);

// The whole content of the regular file at `path`, at most `max_bytes`
// (reads one byte past the limit rather than trusting the size fstat reports,
// which can change while reading). Returns the status of the calling
// thread's cancellation (common/cancellation.h) if it is cancelled during the
// read.
absl::StatusOr<std::string> ReadFile(
    const std::string& path,
    uint64_t max_bytes = std::numeric_limits<uint64_t>::max());

// Writes `contents` to `path` so that readers see the old file or the whole
// new one, never a part: a temporary file in the same directory, fsync, then
// rename over `path` and fsync the directory, so the new file also survives
// a crash once this returns.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_FILE_H_
