// The `data:` section of a job file for the token sources (job/internal/
// job_parser_data.cc): dtypes and the uint16 alias, llmc, megatron paths and
// blends, documents, and where each error points.
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/data.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_spec.h"

namespace conveyor::job {
namespace {

using engine::DataConfig;
using engine::TokenDType;
using ::testing::HasSubstr;

// A language model over 1000 ids (lines 1-5), the data on line 6 (its
// value from column 7), training and optimizer after it, `extra` from line
// 9.
std::string Job(const std::string& data, const std::string& extra = "") {
  return absl::StrCat(
      "model:\n"
      "  input_shape: [8]\n"
      "  init: {seed: 0}\n"
      "  loss: cross_entropy\n"
      "  layers: [{embedding: {vocab_size: 1000, features: 4}}, {lm_head: "
      "{vocab_size: 1000}}]\n"
      "data: ",
      data,
      "\n"
      "training: {steps: 1, batch_size: 2}\n"
      "optimizer: {kind: sgd, lr: 0.1}\n",
      extra);
}

// "job.yaml:6:<column of `needle` in `data`>".
std::string At(const std::string& data, const std::string& needle) {
  return absl::StrCat("job.yaml:6:", 7 + data.find(needle));
}

DataConfig ParseData(const std::string& data, absl::string_view base = "") {
  absl::StatusOr<JobSpec> job = ParseJobSpec(Job(data), "job.yaml", base);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->data : DataConfig{};
}

std::string Error(const std::string& data, const std::string& extra = "") {
  absl::StatusOr<JobSpec> job = ParseJobSpec(Job(data, extra), "job.yaml");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument)
      << job.status();
  return std::string(job.status().message());
}

TEST(JobSpecDataTest, TokensDTypeAndTheUint16Alias) {
  EXPECT_EQ(ParseData("{source: tokens, path: t, seq_len: 8, dtype: uint32}")
                .token_dtype,
            TokenDType::kUint32);
  EXPECT_EQ(ParseData("{source: tokens, path: t, seq_len: 8, dtype: int32}")
                .token_dtype,
            TokenDType::kInt32);
  EXPECT_EQ(ParseData("{source: tokens, path: t, seq_len: 8}").token_dtype,
            TokenDType::kUint8);
  EXPECT_EQ(ParseData("{source: tokens, path: t, seq_len: 8, uint16: true}")
                .token_dtype,
            TokenDType::kUint16);
  // Both, agreeing.
  EXPECT_EQ(ParseData("{source: tokens, path: t, seq_len: 8, uint16: true, "
                      "dtype: uint16}")
                .token_dtype,
            TokenDType::kUint16);

  std::string data =
      "{source: tokens, path: t, seq_len: 8, dtype: uint32, uint16: true}";
  EXPECT_EQ(Error(data),
            At(data, "true") +
                ": data.uint16: uint16: true means dtype uint16, but dtype "
                "is uint32; give dtype alone");
  data = "{source: tokens, path: t, seq_len: 8, dtype: uint16, uint16: false}";
  EXPECT_THAT(Error(data), HasSubstr("uint16: false means dtype uint8"));
  data = "{source: tokens, path: t, seq_len: 8, dtype: int64}";
  EXPECT_EQ(Error(data), At(data, "int64") +
                             ": data.dtype: unknown token dtype 'int64'; "
                             "allowed: uint8, uint16, uint32, int32");
}

TEST(JobSpecDataTest, LlmcTakesNoDType) {
  const DataConfig llmc =
      ParseData("{source: llmc, path: shard.bin, seq_len: 8, vocab_size: 900}");
  EXPECT_EQ(llmc.kind, DataConfig::Kind::kLlmc);
  EXPECT_EQ(llmc.path, "shard.bin");
  EXPECT_EQ(llmc.vocab_size, 900);
  const std::string data = "{source: llmc, path: s, seq_len: 8, dtype: uint16}";
  EXPECT_EQ(Error(data),
            At(data, "dtype") +
                ": data: 'dtype' does not apply to source llmc; it takes: "
                "source, seed, shuffle, path, seq_len, vocab_size, documents");
}

TEST(JobSpecDataTest, MegatronPathOrBlend) {
  DataConfig one = ParseData(
      "{source: megatron, path: data/corpus_text_document, seq_len: 8}",
      "/jobs");
  EXPECT_EQ(one.kind, DataConfig::Kind::kMegatron);
  EXPECT_EQ(one.path, "/jobs/data/corpus_text_document");
  EXPECT_TRUE(one.blend.empty());

  DataConfig blend = ParseData(
      "{source: megatron, seq_len: 8, blend: [{path: web, weight: 0.7}, "
      "{path: /data/code, weight: 0.3}]}",
      "/jobs");
  EXPECT_TRUE(blend.path.empty());
  ASSERT_EQ(blend.blend.size(), 2u);
  EXPECT_EQ(blend.blend[0].path, "/jobs/web");
  EXPECT_DOUBLE_EQ(blend.blend[0].weight, 0.7);
  EXPECT_EQ(blend.blend[1].path, "/data/code");
  EXPECT_DOUBLE_EQ(blend.blend[1].weight, 0.3);

  std::string data =
      "{source: megatron, path: p, seq_len: 8, blend: [{path: a, weight: 1}, "
      "{path: b, weight: 1}]}";
  EXPECT_THAT(Error(data),
              HasSubstr(At(data, "p,") + ": data.path: source megatron takes "
                                         "exactly one of 'path'"));
  data = "{source: megatron, seq_len: 8}";
  EXPECT_THAT(Error(data), HasSubstr("job.yaml:6:7: data: source megatron "
                                     "takes exactly one of"));
  data = "{source: megatron, seq_len: 8, blend: [{path: a, weight: 1}]}";
  EXPECT_EQ(Error(data), At(data, "[") +
                             ": data.blend: must be a list of 2 to 4096 "
                             "{path, weight} maps; got 1 items (give one "
                             "data set as data.path)");
  data =
      "{source: megatron, seq_len: 8, blend: [{path: a, weight: 1}, "
      "{path: b}]}";
  EXPECT_THAT(Error(data),
              HasSubstr("data.blend[1]: missing required key 'weight'"));
  data =
      "{source: megatron, seq_len: 8, blend: [{path: a, weight: 0}, "
      "{path: b, weight: 1}]}";
  EXPECT_THAT(Error(data),
              HasSubstr(At(data, "0}") +
                        ": data.blend[0].weight: must be a positive number"));
  data =
      "{source: megatron, seq_len: 8, blend: [{path: a, weight: 1, "
      "x: 2}, {path: b, weight: 1}]}";
  EXPECT_THAT(Error(data), HasSubstr("unknown key 'x'; allowed: path, weight"));
  data = "{source: tokens, path: t, seq_len: 8, blend: []}";
  EXPECT_THAT(Error(data),
              HasSubstr("'blend' does not apply to source tokens"));
}

TEST(JobSpecDataTest, Documents) {
  const DataConfig d = ParseData(
      "{source: tokens, path: t, seq_len: 8, dtype: uint16, documents: "
      "{eod_token: 999, reset_position_ids: true, document_mask: true, "
      "eod_mask_loss: true}}");
  EXPECT_EQ(d.documents.eod_token, 999);
  EXPECT_TRUE(d.documents.reset_position_ids);
  EXPECT_TRUE(d.documents.document_mask);
  EXPECT_TRUE(d.documents.eod_mask_loss);
  // Megatron may take its boundaries from the .idx.
  const DataConfig m = ParseData(
      "{source: megatron, path: p, seq_len: 8, documents: {document_mask: "
      "true}}");
  EXPECT_EQ(m.documents.eod_token, -1);
  EXPECT_TRUE(m.documents.document_mask);

  // An EOD outside the model's vocabulary, at the eod_token.
  std::string data =
      "{source: tokens, path: t, seq_len: 8, dtype: uint16, documents: "
      "{eod_token: 1000, document_mask: true}}";
  EXPECT_EQ(Error(data), At(data, "1000") +
                             ": data.documents.eod_token: "
                             "data.documents.eod_token 1000 is outside the "
                             "model's vocabulary 1000");
  // Outside what the dtype or data.vocab_size allows, likewise.
  data = "{source: tokens, path: t, seq_len: 8, documents: {eod_token: 300}}";
  EXPECT_EQ(Error(data), At(data, "300") +
                             ": data.documents.eod_token: must be below 256 "
                             "(what dtype uint8 holds); got 300");
  data =
      "{source: llmc, path: t, seq_len: 8, vocab_size: 500, documents: "
      "{eod_token: 500}}";
  EXPECT_EQ(Error(data), At(data, "500}") +
                             ": data.documents.eod_token: must be below "
                             "data.vocab_size 500; got 500");
  // tokens and llmc need the EOD.
  data =
      "{source: llmc, path: t, seq_len: 8, documents: {eod_mask_loss: "
      "true}}";
  EXPECT_EQ(Error(data),
            At(data, "{eod_mask_loss") +
                ": data.documents: eod_token is required for source llmc: "
                "its file has no document index, so documents end at EOD "
                "tokens");
  data = "{source: tokens, path: t, seq_len: 8, documents: {eod: 1}}";
  EXPECT_THAT(Error(data),
              HasSubstr("unknown key 'eod'; allowed: eod_token, "
                        "reset_position_ids, document_mask, eod_mask_loss"));
  data = "{source: synthetic-regression, documents: {eod_token: 1}}";
  EXPECT_THAT(Error(data), HasSubstr("'documents' does not apply to source "
                                     "synthetic-regression"));
  // The eval section's data is checked the same way.
  EXPECT_THAT(
      Error("{source: tokens, path: t, seq_len: 8, dtype: uint16}",
            "eval: {every: 1, batches: 1, data: {source: tokens, path: v, "
            "seq_len: 8, dtype: uint16, documents: {eod_token: 4000, "
            "document_mask: true}}}\n"),
      HasSubstr("eval.data.documents.eod_token: data.documents.eod_token "
                "4000 is outside the model's vocabulary 1000"));
}

}  // namespace
}  // namespace conveyor::job
