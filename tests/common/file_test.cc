#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "common/cancellation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

std::string Write(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(ReadFileTest, ReadsWholeFilesIncludingEmptyAndBinary) {
  const std::string content("a\0b\nc", 5);
  auto got = ReadFile(Write("file_test_a", content));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, content);
  auto empty = ReadFile(Write("file_test_empty", ""));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "");
}

TEST(ReadFileTest, EnforcesTheLimitExactly) {
  const std::string path = Write("file_test_limit", std::string(100, 'x'));
  EXPECT_TRUE(ReadFile(path, 100).ok());
  auto over = ReadFile(path, 99);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(over.status().message(),
              HasSubstr("larger than the limit of 99 bytes"));
}

TEST(ReadFileTest, ErrorsNameThePathAndTheCause) {
  const std::string missing = ::testing::TempDir() + "/file_test_missing";
  auto m = ReadFile(missing);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr(missing + ": open"));
  auto dir = ReadFile(::testing::TempDir());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dir.status().message(), HasSubstr("not a regular file"));
}

// A named pipe with no writer: a blocking open() waited for one forever
// (a job naming a FIFO as its data wedged a worker). ReadFile must refuse it
// at once; should it block, the test opens the writing end to free it.
TEST(ReadFileTest, RefusesANamedPipeWithoutWaitingForAWriter) {
  const std::string fifo = ::testing::TempDir() + "/file_test_fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::future<absl::StatusOr<std::string>> read =
      std::async(std::launch::async, [&] { return ReadFile(fifo); });
  if (read.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    ADD_FAILURE() << "ReadFile blocked on a FIFO with no writer";
  }
  const absl::StatusOr<std::string> got = read.get();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("not a regular file"));
  std::filesystem::remove(fifo);
}

// A job cancelled while it reads a data or init file of gigabytes stops
// within a chunk of the read, with the cancel's status; outside a cancelled
// job the same read succeeds.
TEST(ReadFileTest, StopsWhenTheCallingJobIsCancelled) {
  const std::string path = Write("file_test_cancel", std::string(1000, 'x'));
  Cancellation cancellation;
  CancellationScope scope(&cancellation);
  EXPECT_TRUE(ReadFile(path).ok());
  cancellation.Cancel(absl::CancelledError("job cancelled"));
  EXPECT_EQ(ReadFile(path).status(), absl::CancelledError("job cancelled"));
}

TEST(CheckDirectoryTest, TellsADirectoryFromNothingAndFromAFile) {
  const std::string dir = ::testing::TempDir() + "/check_directory_test";
  std::filesystem::remove_all(dir);
  const absl::Status missing = CheckDirectory(dir, "step directory");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.message(), dir + ": no such step directory");

  std::filesystem::create_directories(dir);
  EXPECT_TRUE(CheckDirectory(dir, "step directory").ok());
  // Through a link, as a checkpoint directory may be reached.
  const std::string link = dir + ".link";
  std::filesystem::remove(link);
  std::filesystem::create_directory_symlink(dir, link);
  EXPECT_TRUE(CheckDirectory(link, "step directory").ok());

  const std::string file = Write("check_directory_file", "x");
  const absl::Status not_dir = CheckDirectory(file, "step directory");
  EXPECT_EQ(not_dir.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(not_dir.message(), HasSubstr("not a directory"));
}

TEST(WriteFileAtomicallyTest, ReplacesTheWholeFileAndLeavesNoTemporary) {
  const std::string dir = ::testing::TempDir() + "/file_test_atomic";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/addr";
  ASSERT_TRUE(WriteFileAtomically(path, "first, longer content").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(*ReadFile(path), "second");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
  absl::Status bad = WriteFileAtomically(dir + "/missing/addr", "x");
  EXPECT_EQ(bad.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bad.message(), HasSubstr("missing/addr"));
}

}  // namespace
}  // namespace conveyor
