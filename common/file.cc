#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cancellation.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

// 64 MiB: about 20 ms from the page cache, a fraction of a second from disk.
constexpr size_t kReadChunkBytes = size_t{64} << 20;

}  // namespace

absl::Status ErrnoError(int err, absl::string_view path,
                        absl::string_view operation) {
  return absl::ErrnoToStatus(err, absl::StrCat(path, ": ", operation));
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path) {
  // O_NONBLOCK: open() of a FIFO returns at once, and the fstat below
  // refuses it. Reads of a regular file ignore the flag.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return ErrnoError(errno, path, "open");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, path, "fstat");
  // A directory fails on read; a FIFO or device could block or never end.
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  return RegularFile{.fd = std::move(fd),
                     .size = static_cast<uint64_t>(st.st_size)};
}

absl::Status CheckDirectory(const std::string& path, absl::string_view what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such ", what));
    }
    return ErrnoError(errno, path, "stat");
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     uint64_t max_bytes) {
  ASSIGN_OR_RETURN(RegularFile file, OpenRegularFile(path));
  const int fd = file.fd.get();
  try {
    std::string bytes;
    const uint64_t expected = file.size;
    bytes.resize(static_cast<size_t>(std::min(expected, max_bytes) + 1));
    size_t filled = 0;
    for (;;) {
      if (filled == bytes.size()) {
        if (filled > max_bytes) break;
        bytes.resize(std::min<uint64_t>(2 * bytes.size(), max_bytes + 1));
      }
      // In chunks, so that a job cancelled while it reads gigabytes stops
      // within one chunk (common/cancellation.h).
      RETURN_IF_ERROR(CheckCancelled());
      const ssize_t n =
          ::read(fd, bytes.data() + filled,
                 std::min<size_t>(bytes.size() - filled, kReadChunkBytes));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, path, "read");
      }
      if (n == 0) break;
      filled += static_cast<size_t>(n);
    }
    if (filled > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": larger than the limit of ", max_bytes, " bytes"));
    }
    bytes.resize(filled);
    return bytes;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        path, ": not enough memory to read ", file.size, " bytes"));
  }
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, tmp, "open");
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n =
        ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoError(err, tmp, "write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, tmp, "fsync/close");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, path, "rename");
  }
  // The rename lives in the directory: until the directory is synced, a
  // crash can forget it even though the file's data is on disk.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dir_fd = ::open(dir.empty() ? "." : dir.c_str(),
                            O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, dir, "open directory");
  const int synced = ::fsync(dir_fd);
  const int err = errno;
  ::close(dir_fd);
  if (synced != 0) return ErrnoError(err, dir, "fsync directory");
  return absl::OkStatus();
}

}  // namespace conveyor
