// StagedDirectory (cli/staged_directory.h): an output appears whole or not
// at all; an earlier output is replaced only when asked, and then whole;
// what is not an output (a file, a link, someone's directory, a directory
// holding what must be kept) is never replaced; nothing is left beside the
// target.
#include "cli/staged_directory.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class StagedDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = conveyor::testing_util::FreshTestDir("staged_directory_test");
  }
  void TearDown() override { fs::remove_all(dir_); }

  StagedDirectoryOptions Options(bool overwrite) const {
    return {.overwrite = overwrite,
            .markers = {"config.json", "model.safetensors"},
            .keep = {{(dir_ / "keep" / "ckpt").string(), "the checkpoint"}},
            .what = "an HF checkpoint"};
  }

  // Stages {name: text} for `target` and commits; the commit's result or
  // the first error.
  absl::StatusOr<StagedDirectory::Committed> Write(
      const fs::path& target, bool overwrite,
      const std::vector<std::pair<std::string, std::string>>& files) {
    auto staged = StagedDirectory::Create(target.string(), Options(overwrite));
    if (!staged.ok()) return staged.status();
    auto staging = staged->Stage();
    if (!staging.ok()) return staging.status();
    for (const auto& [name, text] : files) {
      std::ofstream(fs::path(*staging) / name) << text;
    }
    return staged->Commit();
  }

  static std::string Read(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // The entries of dir_, sorted: what is there besides the outputs shows
  // what an export left behind.
  std::vector<std::string> Beside() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

TEST_F(StagedDirectoryTest, ANewOutputAppearsWhole) {
  const fs::path out = dir_ / "a" / "b" / "hf";  // Parents created.
  auto staged = StagedDirectory::Create(out.string(), Options(false));
  ASSERT_TRUE(staged.ok()) << staged.status();
  // Nothing is made until the output is staged.
  EXPECT_FALSE(fs::exists(dir_ / "a"));
  ASSERT_TRUE(staged->Stage().ok());
  std::ofstream(fs::path(staged->path()) / "config.json") << "{}";
  // Nothing at the target until the commit.
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(fs::path(staged->path()).parent_path(), out.parent_path());
  auto done = staged->Commit();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->replaced);
  EXPECT_EQ(Read(out / "config.json"), "{}");
  EXPECT_EQ(std::distance(fs::directory_iterator(out.parent_path()),
                          fs::directory_iterator()),
            1);  // No staging directory beside it.

  // An empty directory is taken, and a trailing separator is the same
  // directory.
  fs::create_directory(dir_ / "empty");
  ASSERT_TRUE(
      Write((dir_ / "empty").string() + "/", false, {{"config.json", "1"}})
          .ok());
  EXPECT_EQ(Read(dir_ / "empty" / "config.json"), "1");
  EXPECT_EQ(Beside(), (std::vector<std::string>{"a", "empty"}));
}

TEST_F(StagedDirectoryTest, AnEarlierOutputIsReplacedOnlyWhenAsked) {
  const fs::path out = dir_ / "hf";
  ASSERT_TRUE(Write(out, false, {{"config.json", "old"}, {"extra", "x"}}).ok());
  auto refused = Write(out, false, {{"config.json", "new"}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("already holds an HF checkpoint (config.json); "
                        "--overwrite replaces it"));
  EXPECT_EQ(Read(out / "config.json"), "old");

  auto done = Write(out, true, {{"config.json", "new"}});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->replaced);
  EXPECT_EQ(done->leftover, "");
  EXPECT_EQ(Read(out / "config.json"), "new");
  EXPECT_FALSE(fs::exists(out / "extra"));  // Whole: the old one is gone.
  EXPECT_EQ(Beside(), std::vector<std::string>{"hf"});
}

TEST_F(StagedDirectoryTest, WhatIsNotAnOutputIsNeverReplaced) {
  std::ofstream(dir_ / "file") << "mine";
  fs::create_directory(dir_ / "notes");
  std::ofstream(dir_ / "notes" / "todo") << "mine";
  fs::create_directory(dir_ / "clone");
  std::ofstream(dir_ / "clone" / "config.json") << "{}";
  fs::create_directory(dir_ / "clone" / ".git");
  fs::create_directory_symlink(dir_ / "clone", dir_ / "link");
  fs::create_directories(dir_ / "keep" / "ckpt");
  std::ofstream(dir_ / "keep" / "config.json") << "{}";
  mkfifo((dir_ / "fifo").c_str(), 0600);
  const std::vector<std::pair<fs::path, std::string>> cases = {
      {dir_ / "file", "exists and is not a directory"},
      {dir_ / "fifo", "exists and is not a directory"},
      {dir_ / "notes", "is not empty and is not an HF checkpoint"},
      {dir_ / "clone", "but also '.git', which is not a plain file"},
      {dir_ / "link", "is a symbolic link"},
      {dir_ / "keep", "is or holds the checkpoint"},
      {dir_ / "keep" / "ckpt", "is or holds the checkpoint"}};
  for (const auto& [target, why] : cases) {
    SCOPED_TRACE(target.string());
    auto r = Write(target, /*overwrite=*/true, {{"config.json", "new"}});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(r.status().message(), HasSubstr(why));
  }
  EXPECT_EQ(Read(dir_ / "file"), "mine");
  EXPECT_EQ(Read(dir_ / "notes" / "todo"), "mine");
  EXPECT_TRUE(fs::exists(dir_ / "clone" / ".git"));
  EXPECT_TRUE(fs::is_symlink(dir_ / "link"));
  EXPECT_TRUE(fs::exists(dir_ / "keep" / "ckpt"));
  EXPECT_EQ(StagedDirectory::Create("/", Options(true)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Beside(), (std::vector<std::string>{"clone", "fifo", "file", "keep",
                                                "link", "notes"}));
}

TEST_F(StagedDirectoryTest, AnUncommittedOutputLeavesNothing) {
  const fs::path out = dir_ / "hf";
  ASSERT_TRUE(Write(out, false, {{"config.json", "old"}}).ok());
  {
    auto staged = StagedDirectory::Create(out.string(), Options(true));
    ASSERT_TRUE(staged.ok());
    ASSERT_TRUE(staged->Stage().ok());
    std::ofstream(fs::path(staged->path()) / "config.json") << "half";
    // A failed export returns before Commit.
  }
  EXPECT_EQ(Read(out / "config.json"), "old");
  EXPECT_EQ(Beside(), std::vector<std::string>{"hf"});
}

TEST_F(StagedDirectoryTest, CommitChecksTheTargetAgain) {
  const fs::path out = dir_ / "hf";
  auto staged = StagedDirectory::Create(out.string(), Options(false));
  ASSERT_TRUE(staged.ok());
  ASSERT_TRUE(staged->Stage().ok());
  // Someone else's output appeared meanwhile.
  fs::create_directory(out);
  std::ofstream(out / "model.safetensors") << "theirs";
  auto r = staged->Commit();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Read(out / "model.safetensors"), "theirs");
}

}  // namespace
}  // namespace conveyor::cli
