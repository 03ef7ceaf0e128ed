// Documents in packed windows (engine/data.h DocumentsConfig, DataSource::
// Documents, eod_mask_loss): layouts worked out by hand from EOD tokens and
// from a Megatron document index, and the configuration errors.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/data.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/data_test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace data_testing;  // NOLINT: the helpers of this test family.
using Kind = DataConfig::Kind;

constexpr int64_t kEod = 9;
constexpr int64_t kIg = kIgnoredTarget;

std::string CreateError(const DataConfig& config, const SampleShapes& shapes) {
  absl::StatusOr<std::unique_ptr<DataSource>> source =
      DataSource::Create(config, shapes);
  EXPECT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(source.status().message());
}

DocumentLayout Layout(DataSource& source, int64_t step, int64_t batch) {
  absl::StatusOr<DocumentLayout> layout = source.Documents(step, 0, 1, batch);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return layout.ok() ? *layout : DocumentLayout{};
}

// Tokens 1 2 E 3 4 5 E 6 E 7 8 (E = 9, the EOD), seq_len 5:
//   window 0: 1 2 E 3 4 | 5    (documents: 1 2 E, then 3 4 ...)
//   window 1: 5 E 6 E 7 | 8    (starts inside the document 3 4 5 E)
DataConfig EodConfig() {
  const std::string path = TempPath("eod.bin");
  WriteBytes(path, std::string("\x01\x02\x09\x03\x04\x05\x09\x06\x09\x07\x08"));
  DataConfig config = TokenConfig(Kind::kTokens, path, 5);
  config.documents = {.eod_token = kEod,
                      .reset_position_ids = true,
                      .document_mask = true,
                      .eod_mask_loss = true};
  return config;
}

TEST(DocumentsTest, EodTokensEndTheirDocuments) {
  auto source = MustCreate(EodConfig(), LanguageModel(5));
  ASSERT_TRUE(source);
  const DocumentLayout layout = Layout(*source, 0, 2);
  EXPECT_EQ(layout.rows, 2);
  EXPECT_EQ(layout.seq_len, 5);
  // The token after each EOD starts a document at position 0; window 1
  // counts its first (mid-document) token from 0 as Megatron does.
  EXPECT_THAT(layout.positions, ElementsAre(0, 1, 2, 0, 1,  //
                                            0, 1, 0, 1, 0));
  EXPECT_THAT(layout.segments, ElementsAre(0, 0, 0, 1, 1,  //
                                           0, 0, 1, 1, 2));
  EXPECT_THAT(Inputs(*source, 0, 2), ElementsAre(1, 2, 9, 3, 4,  //
                                                 5, 9, 6, 9, 7));
  // eod_mask_loss: no loss where the input is the EOD (its target is the
  // next document's first token).
  EXPECT_THAT(Targets(*source, 0, 2), ElementsAre(2, 9, kIg, 4, 5,  //
                                                  9, kIg, 9, kIg, 8));
  // Microbatches see their own rows of the same layout.
  absl::StatusOr<DocumentLayout> second = source->Documents(0, 1, 2, 2);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->rows, 1);
  EXPECT_THAT(second->segments, ElementsAre(0, 0, 1, 1, 2));
}

TEST(DocumentsTest, EachFlagShapesOnlyItsOwnPart) {
  DataConfig config = EodConfig();
  config.documents.reset_position_ids = false;
  auto source = MustCreate(config, LanguageModel(5));
  ASSERT_TRUE(source);
  DocumentLayout layout = Layout(*source, 1, 1);  // Window 1.
  EXPECT_THAT(layout.positions, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(layout.segments, ElementsAre(0, 0, 1, 1, 2));

  config = EodConfig();
  config.documents.document_mask = false;
  config.documents.eod_mask_loss = false;
  source = MustCreate(config, LanguageModel(5));
  ASSERT_TRUE(source);
  layout = Layout(*source, 1, 1);
  EXPECT_THAT(layout.positions, ElementsAre(0, 1, 0, 1, 0));
  EXPECT_THAT(layout.segments, ElementsAre(0, 0, 0, 0, 0));
  EXPECT_THAT(Targets(*source, 1, 1), ElementsAre(9, 6, 9, 7, 8));

  // Without any flag there is no layout, even with an eod_token.
  config.documents.reset_position_ids = false;
  source = MustCreate(config, LanguageModel(5));
  ASSERT_TRUE(source);
  layout = Layout(*source, 0, 2);
  EXPECT_EQ(layout.rows, 0);
  EXPECT_TRUE(layout.positions.empty());
  EXPECT_TRUE(layout.segments.empty());
}

TEST(DocumentsTest, DocumentsChecksItsArgumentsLikeInputs) {
  auto source = MustCreate(EodConfig(), LanguageModel(5));
  ASSERT_TRUE(source);
  absl::StatusOr<DocumentLayout> layout = source->Documents(-1, 0, 1, 2);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("step must be"));
  layout = source->Documents(0, 0, 3, 2);
  EXPECT_THAT(layout.status().message(), HasSubstr("not a multiple"));
}

// Documents {1 2 3} {4 5} {} {6 7 8 9 10}: stream 1..10, documents start at
// tokens 0, 3, 5 (the empty one), 5. seq_len 4:
//   window 0: tokens 0..4 = 1 2 3 4 | 5     (4 starts a document)
//   window 1: tokens 4..8 = 5 6 7 8 | 9     (6 starts one)
DataConfig IndexConfig() {
  const std::string prefix = TempPath("doc_index");
  WriteMegatron(prefix, MegatronDType::kUint16,
                {{1, 2, 3}, {4, 5}, {}, {6, 7, 8, 9, 10}});
  DataConfig config = TokenConfig(Kind::kMegatron, prefix, 4);
  config.documents = {
      .reset_position_ids = true, .document_mask = true, .eod_mask_loss = true};
  return config;
}

TEST(DocumentsTest, MegatronWithoutEodTokenUsesTheDocumentIndex) {
  auto source = MustCreate(IndexConfig(), LanguageModel(4));
  ASSERT_TRUE(source);
  const DocumentLayout layout = Layout(*source, 0, 2);
  EXPECT_THAT(layout.positions, ElementsAre(0, 1, 2, 0,  //
                                            0, 0, 1, 2));
  EXPECT_THAT(layout.segments, ElementsAre(0, 0, 0, 1,  //
                                           0, 1, 1, 1));
  EXPECT_THAT(Inputs(*source, 0, 2), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
  // No loss for predicting a document's first token from the one before.
  EXPECT_THAT(Targets(*source, 0, 2), ElementsAre(2, 3, kIg, 5,  //
                                                  kIg, 7, 8, 9));
}

TEST(DocumentsTest, AnEodTokenWinsOverTheIndex) {
  DataConfig config = IndexConfig();
  config.documents.eod_token = 7;
  auto source = MustCreate(config, LanguageModel(4));
  ASSERT_TRUE(source);
  // Window 1 (5 6 7 8): only the token after 7 starts a document.
  const DocumentLayout layout = Layout(*source, 1, 1);
  EXPECT_THAT(layout.positions, ElementsAre(0, 1, 2, 0));
  EXPECT_THAT(layout.segments, ElementsAre(0, 0, 0, 1));
  EXPECT_THAT(Targets(*source, 1, 1), ElementsAre(6, 7, kIg, 9));
}

TEST(DocumentsTest, ConfigurationErrors) {
  // Kinds without tokens.
  DataConfig synthetic;
  synthetic.documents.document_mask = true;
  EXPECT_THAT(CreateError(synthetic, {.input = {4}, .target = {1}}),
              HasSubstr("data.documents does not apply to data.source "
                        "synthetic-regression"));
  // tokens and llmc have no index to fall back on.
  DataConfig config = EodConfig();
  config.documents.eod_token = -1;
  EXPECT_THAT(CreateError(config, LanguageModel(5)),
              HasSubstr("data.documents.eod_token is required for "
                        "data.source tokens"));
  // An EOD the model has no row for.
  config = EodConfig();
  config.documents.eod_token = 300;
  EXPECT_THAT(CreateError(config, LanguageModel(5, 256)),
              HasSubstr("data.documents.eod_token 300 is outside the model's "
                        "vocabulary 256"));
  config.vocab_size = 200;
  EXPECT_THAT(CreateError(config, LanguageModel(5, 256)),
              HasSubstr("eod_token 300 is outside data.vocab_size 200"));
  // Without a configured bound, the file's dtype bounds it at Create.
  config.vocab_size = 0;
  EXPECT_THAT(CreateError(config, LanguageModel(5)),
              HasSubstr("data.documents.eod_token 300 is not below what uint8 "
                        "can hold 256"));
  config.documents.eod_token = -5;
  EXPECT_THAT(CreateError(config, LanguageModel(5)),
              HasSubstr("eod_token must be a token id, got -5"));
}

}  // namespace
}  // namespace conveyor::engine
