#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/mapped_file_test_" + name;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

TEST(MappedFileTest, MapsTheWholeFile) {
  const std::string path = TempPath("hello");
  WriteBytes(path, "hello, world");
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), 12u);
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*file)->data()), 12),
            "hello, world");
  // Hints change nothing that can be read.
  (*file)->Advise(MappedFile::Access::kRandom);
  (*file)->Advise(MappedFile::Access::kSequential);
  (*file)->Release(0, 12);
  EXPECT_EQ((*file)->data()[7], 'w');
  EXPECT_TRUE((*file)->CheckNotShrunk().ok());
}

TEST(MappedFileTest, RefusesWhatCannotBeMapped) {
  absl::Status missing = MappedFile::Open(TempPath("missing")).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("missing"));

  const std::string empty = TempPath("empty");
  WriteBytes(empty, "");
  absl::Status s = MappedFile::Open(empty).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("empty file"));

  const std::string dir = TempPath("dir");
  std::filesystem::create_directories(dir);
  s = MappedFile::Open(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not a regular file"));

  // A FIFO with no writer: Open must neither block nor map it.
  const std::string fifo = TempPath("fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  s = MappedFile::Open(fifo).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not a regular file"));
}

TEST(MappedFileTest, ReportsAFileThatShrank) {
  const std::string path = TempPath("shrinks");
  WriteBytes(path, std::string(10000, 'x'));
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  absl::Status s = (*file)->CheckNotShrunk();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("shrank from 10000 to 100 bytes"));
  // Growing back is fine: everything mapped is there again.
  ASSERT_EQ(::truncate(path.c_str(), 20000), 0);
  EXPECT_TRUE((*file)->CheckNotShrunk().ok());
}

// A read of pages the file lost under the mapping is SIGBUS; CopyOut turns
// it into DataLoss and the process lives on (a worker reading a data set
// that someone truncates mid-job). Reads of what is still there keep
// working, and out-of-range ranges are refused without touching memory.
TEST(MappedFileTest, CopyOutOfALostPageIsDataLossNotSigbus) {
  const std::string path = TempPath("lost");
  const long page = sysconf(_SC_PAGESIZE);
  std::string bytes(4 * page, 'a');
  bytes[3 * page] = 'z';
  WriteBytes(path, bytes);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  char c = 0;
  ASSERT_TRUE((*file)->CopyOut(3 * page, 1, &c).ok());
  EXPECT_EQ(c, 'z');
  ASSERT_EQ(::truncate(path.c_str(), page), 0);
  std::string out(page, '\0');
  for (int attempt = 0; attempt < 3; ++attempt) {  // The guard is reusable.
    absl::Status s = (*file)->CopyOut(2 * page, page, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr("lost while being read"));
  }
  ASSERT_TRUE((*file)->CopyOut(0, page, out.data()).ok());
  EXPECT_EQ(out, std::string(page, 'a'));
  EXPECT_EQ((*file)->CopyOut(4 * page, 1, &c).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*file)->CopyOut(1, ~uint64_t{0}, &c).code(),
            absl::StatusCode::kInvalidArgument);
}

int64_t ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

TEST(MappedFileTest, ReleaseEveryBoundsWhatAScanKeepsResident) {
  const std::string path = TempPath("scan");
  constexpr uint64_t kBytes = uint64_t{128} << 20;
  { std::ofstream create(path, std::ios::binary | std::ios::trunc); }
  ASSERT_EQ(::truncate(path.c_str(), kBytes), 0);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const int64_t before = ResidentKiB();
  unsigned sum = 0;
  for (uint64_t offset = 0; offset < kBytes; offset += 4096) {
    sum += (*file)->data()[offset];
    (*file)->ReleaseEvery(4096, uint64_t{4} << 20);
  }
  EXPECT_EQ(sum, 0u);  // A sparse file reads as zeros.
  // At most the 4 MiB since the last release stay mapped, not 128 MiB.
  EXPECT_LT(ResidentKiB() - before, 32 * 1024);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace conveyor
