// The tokenizer files an HF export carries (cli/export_tokenizer.h): the
// import's, whichever exist, with a warning for what cannot be copied and
// never an error; --tokenizer paths, checked before anything is written.
#include "cli/export_tokenizer.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ExportTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = conveyor::testing_util::FreshTestDir("export_tokenizer_test");
    fs::create_directories(src_ = dir_ / "src");
    fs::create_directories(out_ = dir_ / "out");
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string Read(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  fs::path dir_, src_, out_;
};

TEST_F(ExportTokenizerTest, CopiesWhicheverTheImportHolds) {
  std::ofstream(src_ / "tokenizer.model") << "spm";
  std::ofstream(src_ / "special_tokens_map.json") << "{}";
  std::ofstream(src_ / "generation_config.json") << "theirs";
  std::ofstream(src_ / "config.json") << "not copied";
  // The checkpoint writer's own generation_config.json stays.
  std::ofstream(out_ / "generation_config.json") << "ours";
  const CopiedFiles r =
      CopyImportedTokenizerFiles(src_.string(), out_.string());
  EXPECT_THAT(r.names,
              ElementsAre("tokenizer.model", "special_tokens_map.json"));
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_EQ(Read(out_ / "tokenizer.model"), "spm");
  EXPECT_EQ(Read(out_ / "generation_config.json"), "ours");
  EXPECT_FALSE(fs::exists(out_ / "config.json"));
}

TEST_F(ExportTokenizerTest, WarnsAboutWhatItCannotCopy) {
  const CopiedFiles gone =
      CopyImportedTokenizerFiles((dir_ / "gone").string(), out_.string());
  EXPECT_TRUE(gone.names.empty());
  EXPECT_THAT(gone.warnings,
              ElementsAre(HasSubstr(
                  "is gone: could not copy its tokenizer files "
                  "(tokenizer.json, tokenizer.model, tokenizer_config.json, "
                  "special_tokens_map.json, generation_config.json)")));

  // No tokenizer; a FIFO where a file should be (read without blocking);
  // a directory named as a file.
  std::ofstream(src_ / "tokenizer_config.json") << "{}";
  mkfifo((src_ / "special_tokens_map.json").c_str(), 0600);
  fs::create_directory(src_ / "generation_config.json");
  const CopiedFiles r =
      CopyImportedTokenizerFiles(src_.string(), out_.string());
  EXPECT_THAT(r.names, ElementsAre("tokenizer_config.json"));
  EXPECT_THAT(r.warnings,
              ElementsAre(HasSubstr("holds neither tokenizer.json nor "
                                    "tokenizer.model"),
                          HasSubstr("could not copy special_tokens_map.json"),
                          HasSubstr("could not copy generation_config.json")));
  EXPECT_FALSE(fs::exists(out_ / "special_tokens_map.json"));
}

TEST_F(ExportTokenizerTest, NamedPathsAreCheckedThenCopied) {
  std::ofstream(src_ / "tokenizer.json") << "bpe";
  std::ofstream(src_ / "tokenizer_config.json") << "cfg";
  std::ofstream(dir_ / "generation_config.json") << "mine";
  std::ofstream(dir_ / "config.json") << "{}";
  std::ofstream(out_ / "generation_config.json") << "writer's";
  const std::vector<std::string> paths = {
      src_.string(), (dir_ / "generation_config.json").string()};
  ASSERT_TRUE(CheckTokenizerPaths(paths).ok());
  auto names = CopyTokenizerPaths(paths, out_.string());
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("generation_config.json", "tokenizer.json",
                                  "tokenizer_config.json"));
  // A file named explicitly replaces the writer's.
  EXPECT_EQ(Read(out_ / "generation_config.json"), "mine");
  EXPECT_EQ(Read(out_ / "tokenizer.json"), "bpe");

  fs::create_directory(dir_ / "empty");
  mkfifo((dir_ / "fifo").c_str(), 0600);
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{(dir_ / "absent").string()}, "no such file or directory"},
      {{(dir_ / "empty").string()}, "holds neither tokenizer.json nor"},
      {{(dir_ / "config.json").string()}, "is the export's own file"},
      {{(dir_ / "fifo").string()}, "neither a directory nor a regular file"},
      {{src_.string(), (src_ / "tokenizer.json").string()},
       "are both tokenizer.json"}};
  for (const auto& [given, why] : bad) {
    SCOPED_TRACE(why);
    const absl::Status s = CheckTokenizerPaths(given);
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(s.message(), HasSubstr(why));
  }
  EXPECT_EQ(CheckTokenizerPaths({(dir_ / "absent").string()}).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace conveyor::cli
