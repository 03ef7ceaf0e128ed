#include "coordinator/state_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

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
  newer[4] = 2;  // The format, little-endian.
  absl::Status status = DecodeState(newer).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("format 2"));
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

}  // namespace
}  // namespace conveyor::coordinator
