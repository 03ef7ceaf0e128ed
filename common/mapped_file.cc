#include "common/mapped_file.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

// The SIGBUS guard of CopyOut: while a thread copies from a mapping, a SIGBUS
// on it (a page the file lost) jumps back into CopyOut. Any other SIGBUS goes
// to the disposition that was there before, as if the guard did not exist.
// Volatile, with signal fences around the copy: otherwise the compiler may
// drop the store before the memcpy as dead, since nothing it sees reads it.
thread_local sigjmp_buf* volatile copy_jump = nullptr;
struct sigaction previous_sigbus;

void OnSigbus(int signal_number, siginfo_t* info, void* context) {
  if (copy_jump != nullptr) siglongjmp(*copy_jump, 1);
  if ((previous_sigbus.sa_flags & SA_SIGINFO) != 0 &&
      previous_sigbus.sa_sigaction != nullptr) {
    previous_sigbus.sa_sigaction(signal_number, info, context);
    return;
  }
  if (previous_sigbus.sa_handler == SIG_IGN) return;
  if (previous_sigbus.sa_handler != SIG_DFL &&
      previous_sigbus.sa_handler != nullptr) {
    previous_sigbus.sa_handler(signal_number);
    return;
  }
  // The default: die of the signal, with its core dump.
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

void InstallSigbusGuard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_sigbus);
  });
}

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

absl::Status MappedFile::CopyOut(uint64_t offset, uint64_t size,
                                 void* out) const {
  if (offset > size_ || size > size_ - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": bytes [", offset, ", ", offset + size,
                     ") are outside its ", size_, " mapped bytes"));
  }
  InstallSigbusGuard();
  sigjmp_buf jump;
  // savemask 1: the jump restores the signal mask the handler ran under.
  if (sigsetjmp(jump, 1) != 0) {
    copy_jump = nullptr;
    return absl::DataLossError(
        absl::StrCat(path_, ": bytes [", offset, ", ", offset + size,
                     ") were lost while being read (the file shrank)"));
  }
  copy_jump = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(out, data_ + offset, size);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  copy_jump = nullptr;
  return absl::OkStatus();
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
