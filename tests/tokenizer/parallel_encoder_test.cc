// ParallelEncoder: the same ids in the same order on any number of
// threads, each document ended by EOS; errors reported by the earliest
// batch that has one; and never more than max_pending_batches in flight.
#include "tokenizer/parallel_encoder.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"
#include "tests/tokenizer/tokenizer_json_builder.h"

namespace conveyor::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Tokenizer> Small(bool with_eos = true) {
  testing::TokenizerJsonBuilder b;
  b.merges = {{"t", "h"}, {"th", "e"}};  // 256 "th", 257 "the"
  b.split_pattern = testing::kLlama3Pattern;
  if (with_eos) b.added_tokens = {{"<|end_of_text|>", 258}};
  const std::string dir = testing_util::FreshTestDir("encoder").string();
  testing::WriteText(dir + "/tokenizer.json", b.Json().dump());
  return *Tokenizer::Load(dir);
}

DocumentBatch Batch(std::vector<std::string> records, int64_t first_line = 1) {
  DocumentBatch batch;
  batch.source = "in.jsonl";
  batch.first_line = first_line;
  for (const std::string& r : records) batch.bytes += r.size();
  batch.records = std::move(records);
  return batch;
}

TEST(ParallelEncoderTest, SameIdsInOrderOnAnyNumberOfThreads) {
  const auto tokenizer = Small();
  std::vector<int64_t> reference;
  for (int threads : {1, 3, 8}) {
    std::vector<int64_t> ids;
    std::vector<int64_t> lengths;
    ParallelEncoder::Options options;
    options.threads = threads;
    auto encoder = *ParallelEncoder::Create(
        *tokenizer, options, nullptr, [&](EncodedBatch& batch) {
          ids.insert(ids.end(), batch.ids.begin(), batch.ids.end());
          lengths.insert(lengths.end(), batch.lengths.begin(),
                         batch.lengths.end());
          return absl::OkStatus();
        });
    for (int i = 0; i < 200; ++i) {
      // Documents of different lengths, so that batches finish out of order.
      std::string text;
      for (int j = 0; j < (i * 37) % 50; ++j) text += "the ";
      ASSERT_TRUE(
          encoder->Submit(Batch({text + std::to_string(i), "the"})).ok());
    }
    ASSERT_TRUE(encoder->Finish().ok());
    ASSERT_EQ(lengths.size(), 400u);
    EXPECT_EQ(lengths[1], 2);  // "the" + EOS.
    if (reference.empty()) {
      reference = ids;
      // The first document: "0" then EOS; the second: "the" then EOS.
      EXPECT_THAT(std::vector<int64_t>(ids.begin(), ids.begin() + 4),
                  ElementsAre(48, 258, 257, 258));
    } else {
      EXPECT_EQ(ids, reference) << threads << " threads";
    }
  }
}

TEST(ParallelEncoderTest, EmptyDocumentsAndSkippedRecordsAreLeftOut) {
  const auto tokenizer = Small();
  EncodedBatch out;
  auto encoder = *ParallelEncoder::Create(
      *tokenizer, {},
      [](std::string* record, const std::string&, int64_t) {
        return absl::StatusOr<bool>(*record != "skip");
      },
      [&](EncodedBatch& batch) {
        out = std::move(batch);
        return absl::OkStatus();
      });
  ASSERT_TRUE(encoder->Submit(Batch({"the", "", "skip", "the"})).ok());
  ASSERT_TRUE(encoder->Finish().ok());
  EXPECT_THAT(out.ids, ElementsAre(257, 258, 257, 258));
  EXPECT_THAT(out.lengths, ElementsAre(2, 2));
  EXPECT_EQ(out.empty_documents, 1);
  EXPECT_EQ(out.bytes, 10u);  // "the" "" "skip" "the".
}

TEST(ParallelEncoderTest, TheEarliestBatchsErrorIsReported) {
  const auto tokenizer = Small();
  ParallelEncoder::Options options;
  options.threads = 4;
  int delivered = 0;
  auto encoder = *ParallelEncoder::Create(
      *tokenizer, options,
      [](std::string* record, const std::string& source,
         int64_t line) -> absl::StatusOr<bool> {
        if (*record == "bad") {
          return absl::InvalidArgumentError(absl::StrCat(source, ":", line));
        }
        return true;
      },
      [&](EncodedBatch&) {
        ++delivered;
        return absl::OkStatus();
      });
  absl::Status status;
  for (int i = 0; i < 20 && status.ok(); ++i) {
    // Batches 5 and 9 fail, at their second line.
    const bool bad = i == 5 || i == 9;
    status = encoder->Submit(Batch({"the", bad ? "bad" : "the"}, 1 + 2 * i));
  }
  if (status.ok()) status = encoder->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "in.jsonl:12");
  EXPECT_EQ(delivered, 5);
  // It stays failed.
  EXPECT_EQ(encoder->Submit(Batch({"the"})), status);
  EXPECT_EQ(encoder->Finish(), status);
}

TEST(ParallelEncoderTest, SinkErrorsStopTheEncoder) {
  const auto tokenizer = Small();
  auto encoder = *ParallelEncoder::Create(
      *tokenizer, {}, nullptr,
      [](EncodedBatch&) { return absl::DataLossError("disk full"); });
  absl::Status status = encoder->Submit(Batch({"the"}));
  if (status.ok()) status = encoder->Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
}

TEST(ParallelEncoderTest, AtMostMaxPendingBatchesInFlight) {
  const auto tokenizer = Small();
  ParallelEncoder::Options options;
  options.threads = 2;
  options.max_pending_batches = 3;
  int delivered = 0;
  auto encoder = *ParallelEncoder::Create(*tokenizer, options, nullptr,
                                          [&](EncodedBatch&) {
                                            ++delivered;
                                            return absl::OkStatus();
                                          });
  for (int submitted = 1; submitted <= 50; ++submitted) {
    ASSERT_TRUE(encoder->Submit(Batch({"the the the"})).ok());
    // Submit returns with fewer than 3 pending.
    EXPECT_GE(delivered, submitted - 2);
  }
  ASSERT_TRUE(encoder->Finish().ok());
  EXPECT_EQ(delivered, 50);
}

TEST(ParallelEncoderTest, RefusesATokenizerWithoutEosAndNoThreads) {
  const auto no_eos = Small(false);
  EXPECT_EQ(
      ParallelEncoder::Create(*no_eos, {}, nullptr, nullptr).status().code(),
      absl::StatusCode::kFailedPrecondition);
  const auto tokenizer = Small();
  ParallelEncoder::Options options;
  options.threads = 0;
  EXPECT_EQ(ParallelEncoder::Create(*tokenizer, options, nullptr, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor::tokenizer
