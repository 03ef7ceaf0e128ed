#include "coordinator/state_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/little_endian.h"
#include "coordinator/state_journal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat("state_file_test_", getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / name);
  return (dir / name).string();
}

v1::CoordinatorState SomeState() {
  v1::CoordinatorState state;
  state.set_version("1.2.3");
  state.set_next_job(8);
  v1::JobRecordState* job = state.add_jobs();
  job->mutable_info()->set_id("job-7");
  job->mutable_info()->set_state(v1::RUNNING);
  job->mutable_request()->set_yaml("name: x\n");
  job->mutable_committed()->set_step(4);
  job->set_attempt(2);
  state.add_queue(7);
  return state;
}

TEST(StateFileTest, EncodesAndDecodesTheState) {
  const v1::CoordinatorState state = SomeState();
  absl::StatusOr<v1::CoordinatorState> back = DecodeState(EncodeState(state));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), state.SerializeAsString());
}

TEST(StateFileTest, RefusesEveryDamagedOrForeignFile) {
  const std::string good = EncodeState(SomeState());
  // Every single flipped byte is caught: header fields by their checks,
  // payload bytes by the checksum.
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    const absl::StatusCode code = DecodeState(bad).status().code();
    EXPECT_TRUE(code == absl::StatusCode::kDataLoss ||
                code == absl::StatusCode::kFailedPrecondition)
        << "byte " << i << ": " << code;
  }
  for (size_t n : {size_t{0}, size_t{3}, size_t{19}, good.size() - 1}) {
    EXPECT_EQ(DecodeState(good.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss)
        << n << " bytes";
  }
  EXPECT_THAT(DecodeState(good + "x").status().message(),
              HasSubstr("truncated or padded"));
  EXPECT_THAT(
      DecodeState("name: a job yaml, not a state file\n").status().message(),
      HasSubstr("not a coordinator state file"));
  std::string newer = good;
  newer[4] = 3;  // The format, little-endian.
  absl::Status status = DecodeState(newer).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("format 3"));
}

TEST(StateFileTest, LoadsWhatWasSavedAndNothingBeforeTheFirstSave) {
  const std::string path = TempPath("state");
  absl::StatusOr<std::unique_ptr<StateFile>> file = StateFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::optional<v1::CoordinatorState>> empty = (*file)->Load();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_FALSE(empty->has_value());

  ASSERT_TRUE((*file)->Save(SomeState()).ok());
  absl::StatusOr<std::optional<v1::CoordinatorState>> loaded = (*file)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->next_job(), 8u);

  std::ofstream(path, std::ios::binary | std::ios::trunc) << "garbage";
  const absl::Status corrupt = (*file)->Load().status();
  EXPECT_EQ(corrupt.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.message(), HasSubstr(path));
}

TEST(StateFileTest, ASecondCoordinatorCannotOpenTheSameFile) {
  const std::string path = TempPath("locked");
  absl::StatusOr<std::unique_ptr<StateFile>> first = StateFile::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<StateFile>> second = StateFile::Open(path);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("another coordinator"));
  first->reset();  // The lock goes with it.
  EXPECT_TRUE(StateFile::Open(path).ok());
}

// ---------------------------------------------------------------------------
// The journal.

v1::JobRecordState Record(uint64_t job, v1::JobState state, int64_t steps) {
  v1::JobRecordState record;
  record.mutable_info()->set_id(absl::StrCat("job-", job));
  record.mutable_info()->set_state(state);
  record.mutable_info()->set_steps_done(steps);
  record.mutable_request()->set_yaml(absl::StrCat("name: job", job, "\n"));
  return record;
}

// What the files should hold: the records as the writes left them, kept the
// simple way (a whole map), to check StateFile's replay against.
struct Model {
  std::map<uint64_t, v1::JobRecordState> jobs;
  uint64_t next_job = 1;
  std::vector<uint64_t> queue;

  // One write: job `job` changed to `state` (or, with `remove`, was
  // forgotten); returns what StateFile::Append takes.
  v1::CoordinatorState Change(uint64_t job, v1::JobState state, int64_t steps,
                              std::vector<uint64_t>* removed) {
    v1::CoordinatorState changed;
    changed.set_version("1.2.3");
    if (state == v1::JOB_STATE_UNSPECIFIED) {
      jobs.erase(job);
      removed->push_back(job);
    } else {
      jobs[job] = Record(job, state, steps);
      *changed.add_jobs() = jobs[job];
    }
    next_job = std::max(next_job, job + 1);
    changed.set_next_job(next_job);
    queue.erase(std::remove(queue.begin(), queue.end(), job), queue.end());
    if (state == v1::QUEUED) queue.push_back(job);
    for (uint64_t n : queue) changed.add_queue(n);
    return changed;
  }

  v1::CoordinatorState State() const {
    v1::CoordinatorState state;
    state.set_version("1.2.3");
    state.set_next_job(next_job);
    for (const auto& [number, record] : jobs) *state.add_jobs() = record;
    for (uint64_t n : queue) state.add_queue(n);
    return state;
  }
};

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Opens `path` as a coordinator starting again would, and loads it.
absl::StatusOr<std::optional<v1::CoordinatorState>> Reload(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<StateFile>> file = StateFile::Open(path);
  if (!file.ok()) return file.status();
  return (*file)->Load();
}

MATCHER_P(HoldsState, expected, "") {
  if (!arg.ok() || !arg->has_value()) {
    *result_listener << "loaded " << arg.status();
    return false;
  }
  if ((*arg)->SerializeAsString() == expected.SerializeAsString()) return true;
  *result_listener << "loaded " << (*arg)->ShortDebugString();
  return false;
}

// A model and its file after a Save and writes of jobs 1 to 4 (3 finished,
// 1 then forgotten, 2 and 4 queued).
struct Written {
  Model model;
  std::unique_ptr<StateFile> file;
};

Written WriteSome(const std::string& path, StateFileOptions options = {}) {
  Written out;
  absl::StatusOr<std::unique_ptr<StateFile>> file =
      StateFile::Open(path, std::move(options));
  EXPECT_TRUE(file.ok()) << file.status();
  out.file = *std::move(file);
  EXPECT_TRUE(out.file->Load().ok());
  EXPECT_TRUE(out.file->Save(out.model.State()).ok());
  const std::vector<std::tuple<uint64_t, v1::JobState, int64_t>> writes = {
      {1, v1::QUEUED, 0},    {2, v1::QUEUED, 0},
      {1, v1::RUNNING, 5},   {3, v1::QUEUED, 0},
      {3, v1::SUCCEEDED, 9}, {1, v1::JOB_STATE_UNSPECIFIED, 0},
      {4, v1::QUEUED, 0}};
  for (const auto& [job, state, steps] : writes) {
    std::vector<uint64_t> removed;
    const v1::CoordinatorState changed =
        out.model.Change(job, state, steps, &removed);
    EXPECT_TRUE(out.file->Append(changed, removed).ok());
  }
  return out;
}

TEST(StateFileJournalTest, ReplaysTheWritesInOrder) {
  const std::string path = TempPath("replay");
  std::filesystem::remove(path + ".journal");
  Written written = WriteSome(path);
  EXPECT_EQ(written.file->stats().appends, 7u);
  EXPECT_EQ(written.file->stats().compactions, 1u);  // The Save.
  EXPECT_THAT(written.file->Load(), HoldsState(written.model.State()));
  written.file.reset();
  absl::StatusOr<std::optional<v1::CoordinatorState>> loaded = Reload(path);
  EXPECT_THAT(loaded, HoldsState(written.model.State()));
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_THAT((*loaded)->queue(), ElementsAre(2, 4));
  EXPECT_EQ((*loaded)->next_job(), 5u);
  EXPECT_EQ((*loaded)->jobs_size(), 3);  // 2, 3, 4; 1 forgotten.
}

TEST(StateFileJournalTest, AnAppendWritesOnlyTheChangedRecords) {
  const std::string path = TempPath("small");
  std::filesystem::remove(path + ".journal");
  Written written = WriteSome(path);
  Model& model = written.model;
  // Many jobs in the snapshot; one changes.
  for (uint64_t job = 10; job < 200; ++job) {
    model.jobs[job] = Record(job, v1::SUCCEEDED, 100);
  }
  model.next_job = 200;
  ASSERT_TRUE(written.file->Save(model.State()).ok());
  const uint64_t snapshot = std::filesystem::file_size(path);
  const uint64_t before = written.file->stats().bytes;
  std::vector<uint64_t> removed;
  ASSERT_TRUE(
      written.file->Append(model.Change(2, v1::RUNNING, 1, &removed), removed)
          .ok());
  const uint64_t appended = written.file->stats().bytes - before;
  EXPECT_EQ(appended, std::filesystem::file_size(path + ".journal") -
                          kJournalHeaderBytes);
  EXPECT_LT(appended * 50, snapshot);
  // Nothing changed: nothing written.
  ASSERT_TRUE(
      written.file->Append(model.Change(2, v1::RUNNING, 1, &removed), removed)
          .ok());
  EXPECT_GT(written.file->stats().bytes, before + appended);  // The record.
  const uint64_t after = written.file->stats().bytes;
  v1::CoordinatorState same;
  same.set_next_job(model.next_job);
  for (uint64_t n : model.queue) same.add_queue(n);
  ASSERT_TRUE(written.file->Append(same, {}).ok());
  EXPECT_EQ(written.file->stats().bytes, after);
  written.file.reset();
  EXPECT_THAT(Reload(path), HoldsState(model.State()));
}

TEST(StateFileJournalTest, CompactsOnceTheJournalOutgrowsTheSnapshot) {
  const std::string path = TempPath("compact");
  std::filesystem::remove(path + ".journal");
  Written written = WriteSome(
      path, StateFileOptions{.compact_ratio = 1, .min_journal_bytes = 0});
  // Each write past the snapshot's size compacts.
  const StateFile::Stats stats = written.file->stats();
  EXPECT_GT(stats.compactions, 1u);
  EXPECT_LT(stats.compactions, 8u);
  EXPECT_LE(std::filesystem::file_size(path + ".journal"),
            std::filesystem::file_size(path));
  EXPECT_EQ(Bytes(path)[4], 2);  // Format 2.
  written.file.reset();
  EXPECT_THAT(Reload(path), HoldsState(written.model.State()));
}

// A crash in the middle of a journal write leaves any prefix of its record:
// every one loads the writes before it (all acknowledged), and the next
// write after the restart is read back too (the torn bytes were cut off).
TEST(StateFileJournalTest, ATornLastRecordAtEveryOffsetLoadsWhatWasAcked) {
  const std::string path = TempPath("torn");
  std::filesystem::remove(path + ".journal");
  Written written = WriteSome(path);
  Model acked = written.model;
  const std::string before = Bytes(path + ".journal");
  std::vector<uint64_t> removed;
  Model last = acked;
  ASSERT_TRUE(
      written.file->Append(last.Change(5, v1::QUEUED, 0, &removed), removed)
          .ok());
  const std::string after = Bytes(path + ".journal");
  written.file.reset();
  ASSERT_GT(after.size(), before.size());
  for (size_t cut = before.size(); cut <= after.size(); ++cut) {
    SCOPED_TRACE(absl::StrCat("cut at byte ", cut));
    WriteBytes(path + ".journal", after.substr(0, cut));
    const Model& expected = cut == after.size() ? last : acked;
    absl::StatusOr<std::unique_ptr<StateFile>> file = StateFile::Open(path);
    ASSERT_TRUE(file.ok());
    absl::StatusOr<std::optional<v1::CoordinatorState>> loaded =
        (*file)->Load();
    ASSERT_THAT(loaded, HoldsState(expected.State()));
    // No id is given again: next_job never goes back.
    EXPECT_GE((*loaded)->next_job(), acked.next_job);
    EXPECT_EQ(std::filesystem::file_size(path + ".journal"),
              cut == after.size() ? after.size() : before.size());
    Model next = expected;
    removed.clear();
    ASSERT_TRUE(
        (*file)->Append(next.Change(6, v1::QUEUED, 0, &removed), removed).ok());
    file->reset();
    EXPECT_THAT(Reload(path), HoldsState(next.State()));
    // Back to the acknowledged files for the next offset.
    WriteBytes(path + ".journal", after);
  }
}

TEST(StateFileJournalTest, AFlippedByteInTheLastRecordLoadsWhatWasAcked) {
  const std::string path = TempPath("flipped");
  std::filesystem::remove(path + ".journal");
  Written written = WriteSome(path);
  const Model acked = written.model;
  const size_t before = std::filesystem::file_size(path + ".journal");
  std::vector<uint64_t> removed;
  Model last = acked;
  ASSERT_TRUE(
      written.file->Append(last.Change(2, v1::RUNNING, 3, &removed), removed)
          .ok());
  const std::string after = Bytes(path + ".journal");
  written.file.reset();
  for (size_t i = before; i < after.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("byte ", i));
    std::string bad = after;
    bad[i] = static_cast<char>(bad[i] ^ 0x08);
    WriteBytes(path + ".journal", bad);
    EXPECT_THAT(Reload(path), HoldsState(acked.State()));
  }
  // A damaged record with acknowledged ones after it is refused, not
  // dropped with them.
  std::string bad = after;
  bad[kJournalHeaderBytes + 20] ^= 0x08;
  WriteBytes(path + ".journal", bad);
  const absl::Status refused = Reload(path).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.message(), HasSubstr(path + ".journal"));
  EXPECT_THAT(refused.message(), HasSubstr("followed by a valid one"));
}

// A compaction stopped at each of its steps, as a crash there would stop
// it: a restart loads every acknowledged write (and perhaps the one under
// way), and the same StateFile, had it lived on, writes again correctly.
TEST(StateFileJournalTest, ACrashAtEveryStepOfACompactionLosesNothing) {
  for (const std::string step :
       {"compact-snapshot", "compact-journal", "compact-reopen", "append"}) {
    SCOPED_TRACE(step);
    const std::string path = TempPath(absl::StrCat("crash-", step));
    std::filesystem::remove(path + ".journal");
    bool armed = false;
    StateFileOptions options;
    if (step != "append") {  // Every write compacts.
      options.compact_ratio = 0;
      options.min_journal_bytes = 0;
    }
    options.TEST_fault = [&](absl::string_view at) {
      return armed && at == step ? absl::AbortedError("crash")
                                 : absl::OkStatus();
    };
    Written written = WriteSome(path, options);
    const Model acked = written.model;
    // Debris of a crash inside WriteFileAtomically, before its rename.
    WriteBytes(absl::StrCat(path, ".tmp.", getpid() + 1), "half a snapshot");

    Model tried = acked;
    std::vector<uint64_t> removed;
    armed = true;
    EXPECT_EQ(
        written.file->Append(tried.Change(7, v1::QUEUED, 0, &removed), removed)
            .code(),
        absl::StatusCode::kAborted);
    armed = false;
    // The crash: what is on disk now is all a restart has.
    const std::string snapshot = Bytes(path);
    const std::string journal = Bytes(path + ".journal");

    // Had it lived on: its next write holds the failed one's changes too.
    Model next = tried;
    removed.clear();
    ASSERT_TRUE(
        written.file->Append(next.Change(8, v1::QUEUED, 0, &removed), removed)
            .ok());
    written.file.reset();
    EXPECT_THAT(Reload(path), HoldsState(next.State()));

    // A restart after the crash.
    WriteBytes(path, snapshot);
    WriteBytes(path + ".journal", journal);
    absl::StatusOr<std::unique_ptr<StateFile>> file = StateFile::Open(path);
    ASSERT_TRUE(file.ok());
    absl::StatusOr<std::optional<v1::CoordinatorState>> loaded =
        (*file)->Load();
    ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
    // The write under way may have landed (its snapshot was renamed).
    const bool landed = step == "compact-journal" || step == "compact-reopen";
    EXPECT_THAT(loaded, HoldsState((landed ? tried : acked).State()));
    EXPECT_GE((*loaded)->next_job(), acked.next_job);
    // And it writes on correctly.
    Model restarted = landed ? tried : acked;
    removed.clear();
    ASSERT_TRUE(
        (*file)
            ->Append(restarted.Change(9, v1::QUEUED, 0, &removed), removed)
            .ok());
    file->reset();
    EXPECT_THAT(Reload(path), HoldsState(restarted.State()));
  }
}

TEST(StateFileJournalTest, UpgradesAFormat1FileOnItsFirstWrite) {
  const std::string path = TempPath("format1");
  std::filesystem::remove(path + ".journal");
  Model model;
  std::vector<uint64_t> removed;
  model.Change(3, v1::QUEUED, 0, &removed);
  // Format 1, as earlier releases wrote it: a 20-byte header, no
  // generation, and no journal.
  std::string payload;
  model.State().SerializeToString(&payload);
  std::string file = "CVYS";
  file.append("\x01\0\0\0", 4);
  char crc[4], length[8];
  PutU32(crc, Crc32c(std::span<const uint8_t>(
                  reinterpret_cast<const uint8_t*>(payload.data()),
                  payload.size())));
  PutU64(length, payload.size());
  file.append(crc, 4);
  file.append(length, 8);
  file += payload;
  WriteBytes(path, file);
  absl::StatusOr<std::unique_ptr<StateFile>> opened = StateFile::Open(path);
  ASSERT_TRUE(opened.ok());
  EXPECT_THAT((*opened)->Load(), HoldsState(model.State()));
  ASSERT_TRUE((*opened)
                  ->Append(model.Change(4, v1::QUEUED, 0, &removed), removed)
                  .ok());
  // Rewritten as format 2 (which earlier releases refuse, rather than read
  // without its journal).
  EXPECT_EQ(Bytes(path)[4], 2);
  EXPECT_TRUE(std::filesystem::exists(path + ".journal"));
  opened->reset();
  EXPECT_THAT(Reload(path), HoldsState(model.State()));
}

TEST(StateFileJournalTest, RefusesAJournalThatIsNotAFileOrDoesNotFit) {
  const std::string path = TempPath("hostile");
  std::filesystem::remove_all(path + ".journal");
  Written written = WriteSome(path);
  written.file.reset();
  const std::string journal = Bytes(path + ".journal");

  std::filesystem::remove(path + ".journal");
  std::filesystem::create_directory(path + ".journal");
  absl::Status status = Reload(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path + ".journal: not a regular"));
  std::filesystem::remove(path + ".journal");

  ASSERT_EQ(::mkfifo((path + ".journal").c_str(), 0600), 0);
  status = Reload(path).status();  // Never waits for a writer.
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path + ".journal: not a regular"));
  std::filesystem::remove(path + ".journal");

  WriteBytes(path + ".journal", "garbage");
  status = Reload(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("no CVYJ header"));

  // A journal continuing a snapshot newer than the one there.
  WriteBytes(path + ".journal", EncodeJournalHeader(1000));
  status = Reload(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("generation 1000"));

  // A journal without its snapshot.
  WriteBytes(path + ".journal", journal);
  const std::string snapshot = Bytes(path);
  std::filesystem::remove(path);
  status = Reload(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("without its snapshot"));
  WriteBytes(path, snapshot);
  EXPECT_TRUE(Reload(path).ok());
}

// The snapshot replaced by a directory (a full disk, as the integration test
// stages it): appending to the journal alone would not be durable, so the
// write compacts and fails; once the path is free, the next write holds it
// all.
TEST(StateFileJournalTest, ASnapshotReplacedBehindItsBackIsWrittenAnew) {
  const std::string path = TempPath("replaced");
  std::filesystem::remove(path + ".journal");
  Written written = WriteSome(path);
  Model& model = written.model;
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  std::vector<uint64_t> removed;
  const absl::Status failed =
      written.file->Append(model.Change(5, v1::QUEUED, 0, &removed), removed);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.message(), HasSubstr(path));
  std::filesystem::remove(path);
  removed.clear();
  ASSERT_TRUE(
      written.file->Append(model.Change(6, v1::QUEUED, 0, &removed), removed)
          .ok());
  written.file.reset();
  EXPECT_THAT(Reload(path), HoldsState(model.State()));
}

}  // namespace
}  // namespace conveyor::coordinator
