#include "coordinator/state_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file.h"

namespace conveyor::coordinator {
namespace {

constexpr char kMagic[4] = {'C', 'V', 'Y', 'S'};
constexpr size_t kHeaderBytes = 20;

void PutLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

uint64_t GetLe(absl::string_view in, size_t offset, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= uint64_t{static_cast<uint8_t>(in[offset + i])} << (8 * i);
  }
  return value;
}

uint32_t Checksum(absl::string_view bytes) {
  return Crc32c(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

}  // namespace

std::string EncodeState(const v1::CoordinatorState& state) {
  std::string payload;
  state.SerializeToString(&payload);
  std::string out(kMagic, sizeof(kMagic));
  PutLe(out, kStateFileFormat, 4);
  PutLe(out, Checksum(payload), 4);
  PutLe(out, payload.size(), 8);
  out += payload;
  return out;
}

absl::StatusOr<v1::CoordinatorState> DecodeState(absl::string_view bytes) {
  if (bytes.size() < kHeaderBytes ||
      bytes.substr(0, sizeof(kMagic)) !=
          absl::string_view(kMagic, sizeof(kMagic))) {
    return absl::DataLossError("not a coordinator state file (no CVYS header)");
  }
  const uint32_t format = static_cast<uint32_t>(GetLe(bytes, 4, 4));
  if (format != kStateFileFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("state file format ", format, "; this release reads ",
                     kStateFileFormat));
  }
  const uint32_t crc = static_cast<uint32_t>(GetLe(bytes, 8, 4));
  const uint64_t length = GetLe(bytes, 12, 8);
  if (length != bytes.size() - kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "state file truncated or padded: the header says ", length,
        " payload bytes, the file holds ", bytes.size() - kHeaderBytes));
  }
  const absl::string_view payload = bytes.substr(kHeaderBytes);
  if (Checksum(payload) != crc) {
    return absl::DataLossError("state file checksum mismatch");
  }
  v1::CoordinatorState state;
  if (!state.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError("state file payload does not parse");
  }
  return state;
}

absl::StatusOr<std::unique_ptr<StateFile>> StateFile::Open(
    const std::string& path) {
  const std::string lock_path = path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, lock_path, "open");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat(path,
                       " is in use by another coordinator (it holds the lock "
                       "on ",
                       lock_path, ")"));
    }
    return ErrnoError(err, lock_path, "flock");
  }
  return std::unique_ptr<StateFile>(new StateFile(path, fd));
}

StateFile::~StateFile() { ::close(lock_fd_); }

absl::StatusOr<std::optional<v1::CoordinatorState>> StateFile::Load() const {
  absl::StatusOr<std::string> bytes = ReadFile(path_, kMaxStateFileBytes);
  if (absl::IsNotFound(bytes.status())) {
    return std::optional<v1::CoordinatorState>();
  }
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<v1::CoordinatorState> state = DecodeState(*bytes);
  if (!state.ok()) {
    return absl::Status(state.status().code(),
                        absl::StrCat(path_, ": ", state.status().message()));
  }
  return std::optional<v1::CoordinatorState>(*std::move(state));
}

absl::Status StateFile::Save(const v1::CoordinatorState& state) const {
  return WriteFileAtomically(path_, EncodeState(state));
}

}  // namespace conveyor::coordinator
