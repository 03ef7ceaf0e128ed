#include "common/mapped_file.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

uint64_t PageSize() {
  static const uint64_t page = [] {
    const long size = ::sysconf(_SC_PAGESIZE);
    return size > 0 ? static_cast<uint64_t>(size) : uint64_t{4096};
  }();
  return page;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(RegularFile file, OpenRegularFile(path));
  if (file.size == 0) {
    // mmap of length 0 fails with EINVAL; say what is actually wrong.
    return absl::InvalidArgumentError(absl::StrCat(path, ": empty file"));
  }
  if (file.size > std::numeric_limits<size_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", file.size, " bytes is more than this host can map"));
  }
  void* data = ::mmap(nullptr, static_cast<size_t>(file.size), PROT_READ,
                      MAP_SHARED, file.fd.get(), 0);
  if (data == MAP_FAILED) return ErrnoError(errno, path, "mmap");
  return std::unique_ptr<MappedFile>(new MappedFile(
      path, std::move(file.fd), static_cast<uint8_t*>(data), file.size));
}

MappedFile::~MappedFile() {
  ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

void MappedFile::Advise(Access access) const {
  int advice = MADV_NORMAL;
  switch (access) {
    case Access::kNormal:
      advice = MADV_NORMAL;
      break;
    case Access::kSequential:
      advice = MADV_SEQUENTIAL;
      break;
    case Access::kRandom:
      advice = MADV_RANDOM;
      break;
  }
  ::madvise(const_cast<uint8_t*>(data_), static_cast<size_t>(size_), advice);
}

void MappedFile::Release(uint64_t offset, uint64_t length) const {
  if (offset >= size_) return;
  length = std::min(length, size_ - offset);
  const uint64_t page = PageSize();
  // Whole pages inside the range only: a page shared with bytes outside it
  // may still be wanted (it would be re-read, but why pay).
  const uint64_t begin = (offset + page - 1) / page * page;
  const uint64_t end = (offset + length) / page * page;
  if (end <= begin) return;
  // MADV_DONTNEED on a read-only shared file mapping unmaps the pages from
  // this process only; their contents stay in the page cache.
  ::madvise(const_cast<uint8_t*>(data_ + begin),
            static_cast<size_t>(end - begin), MADV_DONTNEED);
}

void MappedFile::ReleaseEvery(uint64_t bytes, uint64_t period) const {
  const uint64_t total = unreleased_.fetch_add(bytes) + bytes;
  if (total < period) return;
  // One caller wins the reset and releases; the others go on reading.
  uint64_t expected = total;
  while (expected >= period &&
         !unreleased_.compare_exchange_weak(expected, 0)) {
  }
  if (expected >= period) Release(0, size_);
}

absl::Status MappedFile::CheckNotShrunk() const {
  struct stat st;
  if (::fstat(fd_.get(), &st) != 0) return ErrnoError(errno, path_, "fstat");
  if (static_cast<uint64_t>(st.st_size) < size_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": the file shrank from ", size_, " to ",
                     st.st_size, " bytes while in use"));
  }
  return absl::OkStatus();
}

}  // namespace conveyor
