#include "coordinator/state_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/little_endian.h"
#include "common/status_macros.h"
#include "coordinator/ids.h"
#include "coordinator/state_journal.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {
namespace {

constexpr char kMagic[4] = {'C', 'V', 'Y', 'S'};
constexpr size_t kFormat1HeaderBytes = 20;
constexpr size_t kHeaderBytes = 28;

uint32_t Checksum(absl::string_view bytes) {
  return Crc32c(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

// The number of a record's job; 0 for an id that is not "job-<n>" or out of
// the range job numbers take (as JobStore::Restore checks).
uint64_t RecordNumber(const v1::JobRecordState& record) {
  const uint64_t number = JobNumber(record.info().id());
  return number >= (uint64_t{1} << 47) ? 0 : number;
}

// The generation in the journal header at `path`, or 0 when there is none
// that reads: what a new snapshot's generation must exceed, so that a crash
// before the new journal replaces it cannot replay this one onto it.
uint64_t PeekJournalGeneration(const std::string& path) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (!file.ok()) return 0;
  char header[kJournalHeaderBytes];
  if (::pread(file->fd.get(), header, sizeof(header), 0) !=
      static_cast<ssize_t>(sizeof(header))) {
    return 0;
  }
  absl::StatusOr<ParsedJournal> parsed =
      ParseJournal(absl::string_view(header, sizeof(header)));
  return parsed.ok() ? parsed->generation : 0;
}

}  // namespace

std::string EncodeState(const v1::CoordinatorState& state,
                        uint64_t generation) {
  std::string out(kHeaderBytes, '\0');
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  PutU32(out.data() + 4, kStateFileFormat);
  PutU64(out.data() + 20, generation);
  state.AppendToString(&out);
  PutU64(out.data() + 12, out.size() - kHeaderBytes);
  PutU32(out.data() + 8, Checksum(absl::string_view(out).substr(20)));
  return out;
}

absl::StatusOr<DecodedState> DecodeSnapshot(absl::string_view bytes) {
  if (bytes.size() < kFormat1HeaderBytes ||
      bytes.substr(0, sizeof(kMagic)) !=
          absl::string_view(kMagic, sizeof(kMagic))) {
    return absl::DataLossError("not a coordinator state file (no CVYS header)");
  }
  const uint32_t format = GetU32(bytes.data() + 4);
  if (format != 1 && format != kStateFileFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("state file format ", format, "; this release reads 1 to ",
                     kStateFileFormat));
  }
  const size_t header = format == 1 ? kFormat1HeaderBytes : kHeaderBytes;
  if (bytes.size() < header) {
    return absl::DataLossError(
        absl::StrCat("state file truncated: ", bytes.size(), " bytes of a ",
                     header, "-byte header"));
  }
  const uint32_t crc = GetU32(bytes.data() + 8);
  const uint64_t length = GetU64(bytes.data() + 12);
  if (length != bytes.size() - header) {
    return absl::DataLossError(
        absl::StrCat("state file truncated or padded: the header says ", length,
                     " payload bytes, the file holds ", bytes.size() - header));
  }
  // Format 2's checksum covers the generation too.
  if (Checksum(bytes.substr(format == 1 ? header : 20)) != crc) {
    return absl::DataLossError("state file checksum mismatch");
  }
  DecodedState out;
  out.generation = format == 1 ? 0 : GetU64(bytes.data() + 20);
  const absl::string_view payload = bytes.substr(header);
  if (!out.state.ParseFromArray(payload.data(),
                                static_cast<int>(payload.size()))) {
    return absl::DataLossError("state file payload does not parse");
  }
  return out;
}

absl::StatusOr<v1::CoordinatorState> DecodeState(absl::string_view bytes) {
  ASSIGN_OR_RETURN(DecodedState decoded, DecodeSnapshot(bytes));
  return std::move(decoded.state);
}

v1::CoordinatorState StateFile::Records::ToState() const {
  v1::CoordinatorState state;
  state.set_version(version);
  state.set_next_job(next_job);
  for (const auto& [number, record] : jobs) *state.add_jobs() = record;
  for (uint64_t number : queue) state.add_queue(number);
  return state;
}

absl::StatusOr<std::unique_ptr<StateFile>> StateFile::Open(
    const std::string& path, StateFileOptions options) {
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
  return std::unique_ptr<StateFile>(
      new StateFile(path, fd, std::move(options)));
}

StateFile::StateFile(std::string path, int lock_fd, StateFileOptions options)
    : path_(std::move(path)),
      journal_path_(path_ + ".journal"),
      lock_fd_(lock_fd),
      options_(std::move(options)) {}

StateFile::~StateFile() {
  MutexLock lock(mu_);
  CloseJournalLocked();
  ::close(lock_fd_);
}

void StateFile::CloseJournalLocked() {
  if (journal_fd_ >= 0) ::close(journal_fd_);
  journal_fd_ = -1;
  journal_id_.reset();
}

std::optional<StateFile::FileId> StateFile::IdOf(const std::string& path,
                                                 int fd) {
  struct stat st;
  if ((fd >= 0 ? ::fstat(fd, &st) : ::stat(path.c_str(), &st)) != 0 ||
      !S_ISREG(st.st_mode)) {
    return std::nullopt;
  }
  return FileId{
      .dev = st.st_dev,
      .ino = st.st_ino,
      .size = st.st_size,
      .mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
}

absl::Status StateFile::Fault(absl::string_view step) const {
  return options_.TEST_fault ? options_.TEST_fault(step) : absl::OkStatus();
}

StateFile::Stats StateFile::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

absl::StatusOr<std::optional<v1::CoordinatorState>> StateFile::Load() {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(LoadLocked());
  if (!has_snapshot_) return std::optional<v1::CoordinatorState>();
  return std::optional<v1::CoordinatorState>(records_.ToState());
}

absl::Status StateFile::LoadLocked() {
  loaded_ = false;
  broken_ = false;
  CloseJournalLocked();
  records_ = Records();
  has_snapshot_ = false;
  snapshot_id_.reset();
  snapshot_bytes_ = 0;
  generation_ = 0;
  absl::StatusOr<std::string> bytes = ReadFile(path_, kMaxStateFileBytes);
  if (absl::IsNotFound(bytes.status())) {
    struct stat st;
    if (::lstat(journal_path_.c_str(), &st) == 0) {
      return absl::DataLossError(absl::StrCat(
          journal_path_, ": a state journal without its snapshot ", path_,
          " (its records alone are not the coordinator's state; move it "
          "aside too to start without its jobs)"));
    }
    loaded_ = true;  // A first start: nothing saved yet.
    return absl::OkStatus();
  }
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<DecodedState> decoded = DecodeSnapshot(*bytes);
  if (!decoded.ok()) {
    return absl::Status(decoded.status().code(),
                        absl::StrCat(path_, ": ", decoded.status().message()));
  }
  const v1::CoordinatorState& state = decoded->state;
  records_.version = state.version();
  records_.next_job = state.next_job();
  for (const v1::JobRecordState& record : state.jobs()) {
    const uint64_t number = RecordNumber(record);
    if (number == 0 || !records_.jobs.emplace(number, record).second) {
      const std::string id = record.info().id();
      records_ = Records();
      return absl::DataLossError(absl::StrCat(
          path_, ": job id '", id,
          number == 0 ? "' is not job-<n>" : "' is out of range or repeated"));
    }
  }
  records_.queue.assign(state.queue().begin(), state.queue().end());
  has_snapshot_ = true;
  snapshot_id_ = IdOf(path_);
  snapshot_bytes_ = bytes->size();
  generation_ = decoded->generation;
  RETURN_IF_ERROR(LoadJournalLocked(decoded->generation));
  loaded_ = true;
  return absl::OkStatus();
}

absl::Status StateFile::LoadJournalLocked(uint64_t snapshot_generation) {
  absl::StatusOr<std::string> bytes =
      ReadFile(journal_path_, kMaxStateFileBytes);
  // None yet (the first start of a format 1 file, or a crash before the
  // first journal): the next write compacts and starts one.
  if (absl::IsNotFound(bytes.status())) return absl::OkStatus();
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<ParsedJournal> parsed = ParseJournal(*bytes);
  if (!parsed.ok()) {
    return absl::Status(
        parsed.status().code(),
        absl::StrCat(journal_path_, ": ", parsed.status().message()));
  }
  if (parsed->generation < snapshot_generation) {
    // The snapshot was written and the crash came before this journal was
    // replaced: the snapshot holds its records already.
    SPDLOG_INFO("{}: generation {} is older than the snapshot's ({}): ignored",
                journal_path_, parsed->generation, snapshot_generation);
    return absl::OkStatus();
  }
  if (parsed->generation > snapshot_generation) {
    return absl::DataLossError(
        absl::StrCat(journal_path_, ": generation ", parsed->generation,
                     " continues a snapshot newer than ", path_,
                     " (generation ", snapshot_generation, "), which is lost"));
  }
  for (const JournalRecord& record : parsed->records) {
    absl::StatusOr<StateChanges> changes = DecodeChanges(record.payload);
    if (!changes.ok()) {
      return absl::DataLossError(
          absl::StrCat(journal_path_, ": record at byte ", record.offset, ": ",
                       changes.status().message()));
    }
    for (const v1::JobRecordState& job : changes->changed.jobs()) {
      if (RecordNumber(job) == 0) {
        return absl::DataLossError(
            absl::StrCat(journal_path_, ": record at byte ", record.offset,
                         ": job id '", job.info().id(), "' is not job-<n>"));
      }
    }
    ApplyLocked(*changes);
  }
  const int fd = ::open(journal_path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, journal_path_, "open");
  if (!parsed->dropped_tail.empty()) {
    SPDLOG_WARN("{}: {}", journal_path_, parsed->dropped_tail);
    // Cut off now: a record appended after the torn one would be
    // unreachable, and the torn bytes must never be read as a record.
    if (::ftruncate(fd, static_cast<off_t>(parsed->valid_bytes)) != 0 ||
        ::fdatasync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(err, journal_path_, "truncate the torn tail");
    }
  }
  journal_fd_ = fd;
  journal_id_ = IdOf(journal_path_, journal_fd_);
  journal_bytes_ = parsed->valid_bytes;
  next_sequence_ = parsed->records.size() + 1;
  return absl::OkStatus();
}

void StateFile::ApplyLocked(const StateChanges& changes) {
  const v1::CoordinatorState& changed = changes.changed;
  if (!changed.version().empty()) records_.version = changed.version();
  records_.next_job = std::max(records_.next_job, changed.next_job());
  for (uint64_t number : changes.removed) records_.jobs.erase(number);
  for (const v1::JobRecordState& job : changed.jobs()) {
    records_.jobs[RecordNumber(job)] = job;
  }
  if (changes.has_queue) {
    records_.queue.assign(changed.queue().begin(), changed.queue().end());
  }
}

absl::Status StateFile::Save(const v1::CoordinatorState& state) {
  MutexLock lock(mu_);
  if (!loaded_) {
    // Nothing is read from the files, which may be damaged: all is
    // replaced. Only the journal's generation matters (see
    // PeekJournalGeneration).
    CloseJournalLocked();
    generation_ = std::max(generation_, PeekJournalGeneration(journal_path_));
  }
  Records records;
  records.version = state.version();
  records.next_job = state.next_job();
  for (const v1::JobRecordState& record : state.jobs()) {
    const uint64_t number = RecordNumber(record);
    if (number == 0 || !records.jobs.emplace(number, record).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot save job id '", record.info().id(),
                       "': not job-<n>, out of range or repeated"));
    }
  }
  records.queue.assign(state.queue().begin(), state.queue().end());
  records_ = std::move(records);
  loaded_ = true;
  return CompactLocked();
}

absl::Status StateFile::Append(const v1::CoordinatorState& changed,
                               const std::vector<uint64_t>& removed) {
  MutexLock lock(mu_);
  if (!loaded_) RETURN_IF_ERROR(LoadLocked());
  for (const v1::JobRecordState& job : changed.jobs()) {
    if (RecordNumber(job) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot save job id '", job.info().id(), "': not job-<n>"));
    }
  }
  StateChanges changes;
  for (uint64_t number : removed) {
    if (records_.jobs.contains(number)) changes.removed.push_back(number);
  }
  changes.has_queue =
      !std::equal(changed.queue().begin(), changed.queue().end(),
                  records_.queue.begin(), records_.queue.end());
  const bool version_changed =
      !changed.version().empty() && changed.version() != records_.version;
  if (changes.removed.empty() && !changes.has_queue && !version_changed &&
      changed.jobs().empty() && changed.next_job() <= records_.next_job &&
      !broken_) {
    return absl::OkStatus();  // The files hold all of it already.
  }
  changes.changed = changed;
  if (!version_changed) changes.changed.clear_version();
  const std::string payload = EncodeChanges(changes);
  ApplyLocked(changes);
  if (MustCompactLocked(kJournalRecordHeaderBytes + payload.size())) {
    return CompactLocked();
  }
  const std::string record =
      EncodeJournalRecord(generation_, next_sequence_, payload);
  // Any failure from here leaves the journal's end unknown: the next write
  // compacts (broken_), which replaces the journal whole.
  broken_ = true;
  RETURN_IF_ERROR(Fault("append"));
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n =
        ::pwrite(journal_fd_, record.data() + done, record.size() - done,
                 static_cast<off_t>(journal_bytes_ + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, journal_path_, "write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(journal_fd_) != 0) {
    return ErrnoError(errno, journal_path_, "fdatasync");
  }
  broken_ = false;
  journal_bytes_ += record.size();
  journal_id_ = IdOf(journal_path_, journal_fd_);
  ++next_sequence_;
  ++stats_.appends;
  stats_.bytes += record.size();
  return absl::OkStatus();
}

bool StateFile::MustCompactLocked(uint64_t record_bytes) const {
  // No journal of this snapshot's generation yet, or an upgrade from
  // format 1 (whose readers would ignore a journal), or a failed write.
  if (broken_ || journal_fd_ < 0 || generation_ == 0) return true;
  // A file replaced behind our back: appending to the old one (perhaps
  // unlinked) would write to nothing a restart reads.
  if (!snapshot_id_.has_value() || IdOf(path_) != snapshot_id_ ||
      !journal_id_.has_value() || IdOf(journal_path_) != journal_id_) {
    return true;
  }
  const uint64_t bound =
      std::min(kMaxStateFileBytes / 2,
               std::max(options_.min_journal_bytes,
                        options_.compact_ratio * snapshot_bytes_));
  return journal_bytes_ + record_bytes > bound;
}

absl::Status StateFile::CompactLocked() {
  broken_ = true;  // Until every step is done.
  CloseJournalLocked();
  // A new generation for every attempt, even one that failed after its
  // rename: no two snapshots ever share one.
  const uint64_t generation = ++generation_;
  const std::string snapshot = EncodeState(records_.ToState(), generation);
  if (snapshot.size() > kMaxStateFileBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path_, ": the job records take ", snapshot.size(),
                     " bytes, over the limit of ", kMaxStateFileBytes,
                     " (lower max_finished_jobs or the queue's length)"));
  }
  RETURN_IF_ERROR(Fault("compact-snapshot"));
  RETURN_IF_ERROR(WriteFileAtomically(path_, snapshot));
  snapshot_id_ = IdOf(path_);
  snapshot_bytes_ = snapshot.size();
  // A crash from here to the journal's rename leaves the previous
  // generation's journal, which Load ignores.
  RETURN_IF_ERROR(Fault("compact-journal"));
  const std::string header = EncodeJournalHeader(generation);
  RETURN_IF_ERROR(WriteFileAtomically(journal_path_, header));
  RETURN_IF_ERROR(Fault("compact-reopen"));
  const int fd = ::open(journal_path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, journal_path_, "open");
  journal_fd_ = fd;
  journal_id_ = IdOf(journal_path_, journal_fd_);
  journal_bytes_ = header.size();
  next_sequence_ = 1;
  broken_ = false;
  ++stats_.compactions;
  stats_.bytes += snapshot.size() + header.size();
  return absl::OkStatus();
}

}  // namespace conveyor::coordinator
