// Reading documents from text and JSON-lines files: batches cover every
// line once with the right line numbers, errors name file and line, and
// what is not a regular file is refused without blocking.
#include "tokenizer/document_files.h"

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"
#include "tests/tokenizer/tokenizer_json_builder.h"

namespace conveyor::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<DocumentBatch> ReadAll(const std::string& path,
                                   DocumentFormat format, size_t batch_bytes) {
  auto reader = *DocumentFileReader::Open(path, format, batch_bytes);
  std::vector<DocumentBatch> batches;
  while (true) {
    absl::StatusOr<std::optional<DocumentBatch>> batch = reader->Next();
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok() || !batch->has_value()) break;
    batches.push_back(**std::move(batch));
  }
  return batches;
}

TEST(DocumentFilesTest, FormatByNameOrFileName) {
  EXPECT_EQ(*DocumentFormatFor("auto", "a/b.jsonl"),
            DocumentFormat::kJsonLines);
  EXPECT_EQ(*DocumentFormatFor("auto", "b.json"), DocumentFormat::kJsonLines);
  EXPECT_EQ(*DocumentFormatFor("auto", "b.txt"), DocumentFormat::kText);
  EXPECT_EQ(*DocumentFormatFor("jsonl", "b.txt"), DocumentFormat::kJsonLines);
  EXPECT_EQ(*DocumentFormatFor("text", "b.jsonl"), DocumentFormat::kText);
  EXPECT_THAT(DocumentFormatFor("csv", "b").status().message(),
              HasSubstr("not one of auto, text, jsonl"));
}

TEST(DocumentFilesTest, ATextFileIsOneDocument) {
  const std::string dir = testing_util::FreshTestDir("docs").string();
  const std::string text = "line one\n\nline two\xFF\n";
  testing::WriteText(dir + "/a.txt", text);
  const auto batches = ReadAll(dir + "/a.txt", DocumentFormat::kText, 4);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_THAT(batches[0].records, ElementsAre(text));
  EXPECT_EQ(batches[0].bytes, text.size());
  EXPECT_EQ(batches[0].first_line, 0);
  testing::WriteText(dir + "/empty.txt", "");
  const auto empty = ReadAll(dir + "/empty.txt", DocumentFormat::kText, 4);
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_THAT(empty[0].records, ElementsAre(""));
}

TEST(DocumentFilesTest, JsonLinesComeInBatchesWithTheirLineNumbers) {
  const std::string dir = testing_util::FreshTestDir("docs").string();
  std::string text;
  for (int i = 1; i <= 100; ++i) {
    text += "{\"text\": \"" + std::to_string(i) + "\"}\n";
  }
  text += "{\"text\": \"last\"}";  // No final newline.
  testing::WriteText(dir + "/a.jsonl", text);
  const auto batches =
      ReadAll(dir + "/a.jsonl", DocumentFormat::kJsonLines, 100);
  ASSERT_GT(batches.size(), 10u);
  int64_t line = 1;
  uint64_t bytes = 0;
  for (const DocumentBatch& batch : batches) {
    EXPECT_EQ(batch.first_line, line);
    EXPECT_EQ(batch.source, dir + "/a.jsonl");
    for (size_t i = 0; i < batch.records.size(); ++i) {
      std::string record = batch.records[i];
      ASSERT_TRUE(*TextOfJsonLine(&record, "text", batch.source, line));
      EXPECT_EQ(record, line == 101 ? "last" : std::to_string(line));
      ++line;
    }
    bytes += batch.bytes;
  }
  EXPECT_EQ(line, 102);
  EXPECT_EQ(bytes, text.size());
}

TEST(DocumentFilesTest, JsonLineFieldsAndErrors) {
  std::string line =
      "  {\"id\": 3, \"body\": \"caf\\u00e9\\n\", \"text\": 1}\r";
  ASSERT_TRUE(*TextOfJsonLine(&line, "body", "f.jsonl", 7));
  EXPECT_EQ(line, "caf\xC3\xA9\n");
  line = " \t\r";
  EXPECT_FALSE(*TextOfJsonLine(&line, "text", "f.jsonl", 8));  // Blank.
  const auto error = [](std::string text) {
    return std::string(
        TextOfJsonLine(&text, "text", "f.jsonl", 9).status().message());
  };
  EXPECT_THAT(error("{\"text\": \"a\""),
              HasSubstr("f.jsonl:9: not valid JSON"));
  EXPECT_THAT(error("[\"text\"]"),
              HasSubstr("f.jsonl:9: a JSON array, not an object"));
  EXPECT_THAT(error("{\"body\": \"a\"}"),
              HasSubstr("f.jsonl:9: no \"text\" field"));
  EXPECT_THAT(error("{\"text\": null}"),
              HasSubstr("f.jsonl:9: \"text\" is a null, not a string"));
  EXPECT_THAT(error(std::string("{\"text\": \"a\0b\"}", 15)),
              HasSubstr("f.jsonl:9: not valid JSON"));
}

TEST(DocumentFilesTest, RefusesWhatIsNotARegularFile) {
  const std::string dir = testing_util::FreshTestDir("docs").string();
  EXPECT_EQ(
      DocumentFileReader::Open(dir + "/missing.txt", DocumentFormat::kText)
          .status()
          .code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(
      DocumentFileReader::Open(dir, DocumentFormat::kText).status().code(),
      absl::StatusCode::kInvalidArgument);
  const std::string fifo = dir + "/fifo.jsonl";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const absl::Status status =
      DocumentFileReader::Open(fifo, DocumentFormat::kJsonLines).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace conveyor::tokenizer
