// `conveyorctl tokenize`: the Megatron files it writes, read back byte by
// byte against the format (Megatron-LM's indexed_dataset.py) and against
// the tokenizer's own Encode; the same files from 1 and 4 threads; and the
// refusals, each before any output exists.
#include "cli/tokenize_command.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/little_endian.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"
#include "tests/tokenizer/tokenizer_json_builder.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using tokenizer::testing::TokenizerJsonBuilder;
using tokenizer::testing::WriteText;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Dataset {
  uint8_t dtype = 0;
  std::vector<int32_t> sizes;
  std::vector<int64_t> pointers;
  std::vector<int64_t> document_index;
  std::vector<int64_t> ids;  // All of .bin.
};

// Reads PREFIX.idx and PREFIX.bin as Megatron's reader would.
Dataset ReadDataset(const std::string& prefix) {
  Dataset d;
  const std::string idx = ReadBytes(prefix + ".idx");
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(GetU64(idx.data() + 9), 1u);  // Version.
  d.dtype = static_cast<uint8_t>(idx[17]);
  const uint64_t sequences = GetU64(idx.data() + 18);
  const uint64_t documents = GetU64(idx.data() + 26);
  EXPECT_EQ(idx.size(), 34 + sequences * 12 + documents * 8);
  const char* p = idx.data() + 34;
  for (uint64_t i = 0; i < sequences; ++i, p += 4) {
    d.sizes.push_back(static_cast<int32_t>(GetU32(p)));
  }
  for (uint64_t i = 0; i < sequences; ++i, p += 8) {
    d.pointers.push_back(static_cast<int64_t>(GetU64(p)));
  }
  for (uint64_t i = 0; i < documents; ++i, p += 8) {
    d.document_index.push_back(static_cast<int64_t>(GetU64(p)));
  }
  const std::string bin = ReadBytes(prefix + ".bin");
  const size_t item = d.dtype == 8 ? 2 : 4;
  for (size_t i = 0; i + item <= bin.size(); i += item) {
    d.ids.push_back(item == 2 ? GetU16(bin.data() + i)
                              : static_cast<int32_t>(GetU32(bin.data() + i)));
  }
  EXPECT_EQ(bin.size() % item, 0u);
  return d;
}

class TokenizeCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::FreshTestDir("tokenize").string();
    TokenizerJsonBuilder b;
    b.merges = {{"t", "h"}, {"th", "e"}};  // 256 "th", 257 "the"
    b.split_pattern = tokenizer::testing::kLlama3Pattern;
    b.added_tokens = {{"<|end_of_text|>", 258}};
    WriteText(dir_ + "/tokenizer.json", b.Json().dump());
    WriteText(dir_ + "/a.txt", "the cat\n\nthe end");
    WriteText(dir_ + "/b.jsonl",
              "{\"text\": \"the\"}\n\n{\"text\": \"\", \"id\": 2}\n"
              "{\"id\": 3, \"text\": \"a<|end_of_text|>b\"}");
    options_.tokenizer = dir_;
    options_.inputs = {dir_ + "/a.txt", dir_ + "/b.jsonl"};
    options_.output = dir_ + "/out";
  }

  absl::Status Run(std::string* summary = nullptr) {
    std::ostringstream out;
    std::ostringstream err;
    absl::Status status = RunTokenizeCommand(options_, false, out, err);
    if (summary != nullptr) *summary = out.str();
    EXPECT_EQ(err.str(), "");  // No bar when not asked.
    return status;
  }

  std::string dir_;
  TokenizeCommandOptions options_;
};

TEST_F(TokenizeCommandTest, WritesOneSequencePerDocumentEndedByEod) {
  std::string summary;
  ASSERT_TRUE(Run(&summary).ok());
  const Dataset d = ReadDataset(options_.output);
  EXPECT_EQ(d.dtype, 8);  // uint16: 259 ids.
  // a.txt whole; then b.jsonl's "the" and "a<|end_of_text|>b" (its blank
  // line and empty text left out).
  auto t = *tokenizer::Tokenizer::Load(dir_);
  std::vector<int64_t> expected = *t->Encode("the cat\n\nthe end");
  expected.push_back(258);
  EXPECT_THAT(expected, ElementsAre(257, 32, 99, 97, 116, 10, 10, 257, 32, 101,
                                    110, 100, 258));
  expected.insert(expected.end(), {257, 258, 97, 258, 98, 258});
  EXPECT_EQ(d.ids, expected);
  EXPECT_THAT(d.sizes, ElementsAre(13, 2, 4));
  EXPECT_THAT(d.pointers, ElementsAre(0, 26, 30));  // Bytes, 2 an id.
  EXPECT_THAT(d.document_index, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(summary, HasSubstr("tokenized 3 documents"));
  EXPECT_THAT(summary, HasSubstr("1 empty left out"));
  EXPECT_THAT(summary, HasSubstr("into 19 tokens"));
  EXPECT_THAT(summary, HasSubstr("(uint16, EOD 258)"));
  EXPECT_FALSE(fs::exists(options_.output + ".bin.partial"));
}

TEST_F(TokenizeCommandTest, TheSameFilesOnAnyNumberOfThreads) {
  std::string many;
  for (int i = 0; i < 500; ++i) {
    many += "{\"text\": \"the " + std::string(i % 37, 'x') + " " +
            std::to_string(i) + "\"}\n";
  }
  WriteText(dir_ + "/many.jsonl", many);
  options_.inputs = {dir_ + "/many.jsonl", dir_ + "/a.txt"};
  options_.threads = 1;
  ASSERT_TRUE(Run().ok());
  const std::string bin = ReadBytes(options_.output + ".bin");
  const std::string idx = ReadBytes(options_.output + ".idx");
  options_.threads = 4;
  options_.overwrite = true;
  ASSERT_TRUE(Run().ok());
  EXPECT_EQ(ReadBytes(options_.output + ".bin"), bin);
  EXPECT_EQ(ReadBytes(options_.output + ".idx"), idx);
  EXPECT_EQ(ReadDataset(options_.output).sizes.size(), 501u);
}

TEST_F(TokenizeCommandTest, Int32ForVocabulariesPast65536) {
  TokenizerJsonBuilder b;
  b.split_pattern = tokenizer::testing::kLlama3Pattern;
  // A vocabulary of 70001 ids: tokens nothing merges into fill 256..69999.
  for (int64_t id = 256; id < 70000; ++id) {
    b.extra_tokens.push_back({"\x01" + std::to_string(id), id});
  }
  b.added_tokens = {{"<|end_of_text|>", 70000}};
  WriteText(dir_ + "/tokenizer.json", b.Json().dump());
  options_.inputs = {dir_ + "/a.txt"};
  ASSERT_TRUE(Run().ok());
  const Dataset d = ReadDataset(options_.output);
  EXPECT_EQ(d.dtype, 4);
  EXPECT_EQ(d.ids.back(), 70000);
  EXPECT_THAT(d.pointers, ElementsAre(0));
}

TEST_F(TokenizeCommandTest, RefusesBadInputsBeforeWriting) {
  const auto refused = [&](absl::StatusCode code, const std::string& what) {
    const absl::Status status = Run();
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(what));
    EXPECT_FALSE(fs::exists(options_.output + ".bin")) << what;
    EXPECT_FALSE(fs::exists(options_.output + ".idx")) << what;
    EXPECT_FALSE(fs::exists(options_.output + ".bin.partial")) << what;
  };
  const TokenizeCommandOptions good = options_;
  options_.inputs.push_back(dir_ + "/missing.txt");
  refused(absl::StatusCode::kNotFound, "missing.txt");
  options_.inputs = {dir_};
  refused(absl::StatusCode::kInvalidArgument, "not a regular file");
  options_ = good;
  WriteText(dir_ + "/bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 5}\n");
  options_.inputs = {dir_ + "/a.txt", dir_ + "/bad.jsonl"};
  refused(absl::StatusCode::kInvalidArgument,
          "bad.jsonl:2: \"text\" is a number, not a string");
  options_ = good;
  options_.field = "body";
  refused(absl::StatusCode::kInvalidArgument, "b.jsonl:1: no \"body\" field");
  options_ = good;
  options_.output = dir_ + "/no/such/dir/out";
  refused(absl::StatusCode::kNotFound, "no/such/dir");
  options_ = good;
  options_.tokenizer = dir_ + "/missing.json";
  refused(absl::StatusCode::kNotFound, "missing.json");
  options_ = good;
  options_.threads = -1;
  refused(absl::StatusCode::kInvalidArgument, "--threads");
  // A tokenizer without an EOS to end the documents with.
  options_ = good;
  TokenizerJsonBuilder no_eos;
  no_eos.split_pattern = tokenizer::testing::kLlama3Pattern;
  fs::create_directories(dir_ + "/no_eos");
  WriteText(dir_ + "/no_eos/tokenizer.json", no_eos.Json().dump());
  options_.tokenizer = dir_ + "/no_eos";
  refused(absl::StatusCode::kFailedPrecondition, "no EOS");
}

TEST_F(TokenizeCommandTest, ExistingOutputNeedsOverwrite) {
  ASSERT_TRUE(Run().ok());
  const absl::Status status = Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), HasSubstr("out.bin exists; --overwrite"));
  options_.overwrite = true;
  EXPECT_TRUE(Run().ok());
}

TEST_F(TokenizeCommandTest, UnwritableOutputDirectoryIsRefused) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  fs::create_directories(dir_ + "/locked");
  fs::permissions(dir_ + "/locked",
                  fs::perms::owner_read | fs::perms::owner_exec);
  options_.output = dir_ + "/locked/out";
  const absl::Status status = Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  fs::permissions(dir_ + "/locked", fs::perms::owner_all);
}

}  // namespace
}  // namespace conveyor::cli
