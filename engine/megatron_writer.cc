#include "engine/megatron_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"
#include "common/status_macros.h"

namespace conveyor::engine {
namespace {

// Large enough that write(2) calls cost nothing next to tokenizing.
constexpr size_t kBufferBytes = size_t{1} << 20;

// A new file "<path>.XXXXXX" beside `path`, open for writing.
absl::StatusOr<std::pair<std::string, ScopedFd>> CreateTemp(
    const std::string& path) {
  // StrCat, not operator+: GCC 12 warns (-Wrestrict) about the latter.
  std::string name = absl::StrCat(path, ".tmp.XXXXXX");
  ScopedFd fd(::mkostemp(name.data(), O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, path, "create a temporary file");
  return std::make_pair(std::move(name), std::move(fd));
}

absl::Status WriteAll(int fd, const std::string& path, const uint8_t* data,
                      size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "write");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncDirectoryOf(const std::string& path) {
  const std::filesystem::path parent =
      std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, dir, "open");
  if (::fsync(fd.get()) != 0) return ErrnoError(errno, dir, "fsync");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MegatronWriter>> MegatronWriter::Create(
    const std::string& prefix, MegatronDType dtype) {
  if (prefix.empty()) {
    return absl::InvalidArgumentError("Megatron data set prefix is empty");
  }
  if (!IsIntegerMegatronDType(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a Megatron data set of ", MegatronDTypeName(dtype),
                     " cannot hold token ids exactly; use uint16 or int32"));
  }
  ASSIGN_OR_RETURN(auto bin, CreateTemp(MegatronBinPath(prefix)));
  return std::unique_ptr<MegatronWriter>(new MegatronWriter(
      prefix, dtype, std::move(bin.first), std::move(bin.second)));
}

MegatronWriter::~MegatronWriter() {
  if (finished_) return;
  ::unlink(bin_tmp_.c_str());
  if (!idx_tmp_.empty()) ::unlink(idx_tmp_.c_str());
}

absl::Status MegatronWriter::AddDocument(absl::Span<const int64_t> ids) {
  if (finished_ || failed_) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix_, ": the Megatron writer is ",
                     finished_ ? "finished" : "broken by an earlier error"));
  }
  const int64_t document = documents();
  if (ids.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix_, ": document ", document, " has ", ids.size(),
        " tokens; a Megatron index holds at most 2^31 - 1 per sequence"));
  }
  const uint64_t limit = MegatronDTypeIdLimit(dtype_);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<uint64_t>(ids[i]) >= limit) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix_, ": token ", i, " of document ", document,
                       " is ", ids[i], ", which ", MegatronDTypeName(dtype_),
                       " cannot hold (ids must be in [0, ", limit, "))"));
    }
  }
  const int bytes = MegatronDTypeBytes(dtype_);
  for (const int64_t id : ids) {
    if (buffer_.size() + bytes > kBufferBytes) RETURN_IF_ERROR(Flush());
    uint8_t le[8];
    StoreLittleEndian(le, static_cast<uint64_t>(id));
    buffer_.insert(buffer_.end(), le, le + bytes);
  }
  lengths_.push_back(static_cast<int32_t>(ids.size()));
  tokens_ += static_cast<int64_t>(ids.size());
  return absl::OkStatus();
}

absl::Status MegatronWriter::Flush() {
  absl::Status written =
      WriteAll(bin_fd_.get(), bin_tmp_, buffer_.data(), buffer_.size());
  buffer_.clear();
  if (!written.ok()) failed_ = true;
  return written;
}

absl::Status MegatronWriter::WriteIndex(const std::string& path, int fd) const {
  const uint64_t s = lengths_.size();
  std::vector<uint8_t> out;
  out.reserve(kMegatronIndexHeaderBytes + 20 * s + 8);
  auto put = [&](auto value) {
    uint8_t le[sizeof(value)];
    StoreLittleEndian(le, value);
    out.insert(out.end(), le, le + sizeof(value));
  };
  out.insert(out.end(), kMegatronIndexMagic,
             kMegatronIndexMagic + sizeof(kMegatronIndexMagic));
  put(kMegatronIndexVersion);
  put(static_cast<uint8_t>(dtype_));
  put(uint64_t{s});
  put(uint64_t{s + 1});  // One document per sequence, plus the leading 0.
  for (const int32_t length : lengths_) put(static_cast<uint32_t>(length));
  uint64_t pointer = 0;
  for (const int32_t length : lengths_) {
    put(pointer);
    pointer += static_cast<uint64_t>(length) * MegatronDTypeBytes(dtype_);
  }
  for (uint64_t d = 0; d <= s; ++d) put(d);
  return WriteAll(fd, path, out.data(), out.size());
}

absl::Status MegatronWriter::Finish() {
  if (finished_ || failed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix_, ": the Megatron writer is ",
        finished_ ? "already finished" : "broken by an earlier error"));
  }
  // Any failure from here on leaves the temporary files to the destructor.
  failed_ = true;
  RETURN_IF_ERROR(Flush());
  if (::fsync(bin_fd_.get()) != 0) return ErrnoError(errno, bin_tmp_, "fsync");
  const std::string idx_path = MegatronIdxPath(prefix_);
  ASSIGN_OR_RETURN(auto idx, CreateTemp(idx_path));
  idx_tmp_ = std::move(idx.first);
  RETURN_IF_ERROR(WriteIndex(idx_tmp_, idx.second.get()));
  if (::fsync(idx.second.get()) != 0) {
    return ErrnoError(errno, idx_tmp_, "fsync");
  }
  // mkstemp makes 0600 files; a data set is for others to read too. (Not
  // 0666 & ~umask: reading the umask means setting it, which would race
  // with other threads creating files.)
  ::fchmod(bin_fd_.get(), 0644);
  ::fchmod(idx.second.get(), 0644);
  const std::string bin_path = MegatronBinPath(prefix_);
  if (::rename(bin_tmp_.c_str(), bin_path.c_str()) != 0) {
    return ErrnoError(errno, bin_path, "rename");
  }
  if (::rename(idx_tmp_.c_str(), idx_path.c_str()) != 0) {
    const int err = errno;
    // The .bin is in place without its index; a reader would find an old
    // .idx (if any) disagreeing with it, and refuse the pair.
    return ErrnoError(err, idx_path, "rename");
  }
  finished_ = true;
  failed_ = false;
  return SyncDirectoryOf(idx_path);
}

}  // namespace conveyor::engine
