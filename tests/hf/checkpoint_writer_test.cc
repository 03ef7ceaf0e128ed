// Writing HF checkpoints (WriteHfCheckpoint), read back with HfCheckpoint
// and the engine's safetensors reader.
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "checkpoint_test_base.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/checkpoint.h"
#include "nlohmann/json.hpp"

namespace conveyor::hf {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// A source that serves `values` and records what was asked for.
HfTensorSource SourceOf(const std::map<std::string, std::vector<float>>& values,
                        std::vector<std::string>* requested = nullptr) {
  return [&values, requested](
             const std::string& name) -> absl::StatusOr<std::vector<float>> {
    if (requested != nullptr) requested->push_back(name);
    const auto it = values.find(name);
    if (it == values.end()) return absl::NotFoundError("no such tensor");
    return it->second;
  };
}

std::vector<uint16_t> RawBf16(const std::string& path,
                              const std::string& tensor) {
  absl::StatusOr<engine::SafetensorsReader> reader =
      engine::SafetensorsReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return {};
  EXPECT_EQ(reader->Find(tensor)->dtype, engine::DType::kBF16);
  const auto raw = reader->RawBytes(tensor);
  std::vector<uint16_t> bits(raw->size() / 2);
  std::memcpy(bits.data(), raw->data(), raw->size());
  return bits;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(HfCheckpointTest, F32RoundTripIsBitwise) {
  const HfLlamaConfig config = TinyConfig();
  // Arbitrary bit patterns: NaN payloads, subnormals, -0 and infinities
  // included, none of which may change on the way.
  std::mt19937 rng(7);
  std::map<std::string, std::vector<float>> values = ModelValues(config);
  for (auto& [name, v] : values) {
    for (float& x : v) x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  }
  std::vector<float>& embedding = values["layers.0.weight"];
  for (uint32_t bits : {0x7f800001u, 0xffc12345u, 0x00000001u, 0x80000000u,
                        0x7f800000u, 0xff800000u, 0x7f7fffffu}) {
    embedding[bits % embedding.size()] = std::bit_cast<float>(bits);
  }
  ASSERT_TRUE(WriteHfCheckpoint(dir_, config, SourceOf(values),
                                {.dtype = HfDType::kF32})
                  .ok());
  // The temporary files are gone.
  EXPECT_THAT(ListDir(), ElementsAre("config.json", "model.safetensors"));

  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->config(), config);
  EXPECT_TRUE(ckpt->CheckComplete().ok()) << ckpt->CheckComplete();
  for (const auto& [name, v] : values) {
    absl::StatusOr<std::vector<float>> read = ckpt->ReadConveyorTensor(name);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(Bits(*read), Bits(v)) << name;
  }
  const nlohmann::json json =
      nlohmann::json::parse(ReadText(Path("config.json")));
  EXPECT_EQ(json["torch_dtype"], "float32");
  absl::StatusOr<engine::SafetensorsReader> reader =
      engine::SafetensorsReader::Open(Path(kHfWeightsFile));
  ASSERT_TRUE(reader.ok()) << reader.status();
  // transformers refuses weights without this.
  EXPECT_EQ(reader->metadata().at("format"), "pt");
  EXPECT_EQ(reader->Find("model.norm.weight")->dtype, engine::DType::kF32);
  EXPECT_NE(reader->Find("lm_head.weight"), nullptr);
}

TEST_F(HfCheckpointTest, Bf16KeepsRepresentableValuesBitwise) {
  const HfLlamaConfig config = TinyConfig();
  std::map<std::string, std::vector<float>> values = ModelValues(config);
  std::vector<uint16_t> patterns;
  std::mt19937 rng(11);
  for (float& x : values["layers.0.weight"]) {
    uint16_t bits = static_cast<uint16_t>(rng());
    // A signalling NaN comes back quiet; every other pattern exactly.
    if ((bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0) bits |= 0x0040;
    patterns.push_back(bits);
    x = std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  }
  ASSERT_TRUE(WriteHfCheckpoint(dir_, config, SourceOf(values)).ok());
  EXPECT_EQ(RawBf16(Path(kHfWeightsFile), "model.embed_tokens.weight"),
            patterns);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->CheckComplete().ok()) << ckpt->CheckComplete();
  for (const auto& [name, v] : values) {
    absl::StatusOr<std::vector<float>> read = ckpt->ReadConveyorTensor(name);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(Bits(*read), Bits(v)) << name;
  }
  const nlohmann::json json =
      nlohmann::json::parse(ReadText(Path("config.json")));
  EXPECT_EQ(json["torch_dtype"], "bfloat16");
}

TEST_F(HfCheckpointTest, Bf16RoundsToNearestEven) {
  const HfLlamaConfig config = TinyConfig();
  // f32 bits -> the bf16 bits they must become.
  const std::vector<std::pair<uint32_t, uint16_t>> cases = {
      {0x3f800000, 0x3f80},  // 1: exact
      {0x3f808000, 0x3f80},  // halfway between 0x3f80 and 0x3f81: to even
      {0x3f818000, 0x3f82},  // halfway between 0x3f81 and 0x3f82: to even
      {0x3f808001, 0x3f81},  // just above halfway: up
      {0x3f807fff, 0x3f80},  // just below halfway: down
      {0xbf818000, 0xbf82},  // negative, halfway: to even
      {0x3fffffff, 0x4000},  // carries into the exponent
      {0x7f7f7fff, 0x7f7f},  // stays the largest finite bf16
      {0x7f7fffff, 0x7f80},  // FLT_MAX: past bf16's range, infinity
      {0xff7fffff, 0xff80},  // -FLT_MAX: -infinity
      {0x7f800000, 0x7f80},  // infinity
      {0x7f800001, 0x7fc0},  // NaN with a payload only in the low bits
      {0xffc00001, 0xffc0},  // negative quiet NaN
      {0x00008000, 0x0000},  // subnormal, halfway: to even (zero)
      {0x00018000, 0x0002},  // subnormal, halfway: to even
      {0x80000000, 0x8000},  // -0
  };
  std::map<std::string, std::vector<float>> values = ModelValues(config);
  std::vector<float>& embedding = values["layers.0.weight"];
  std::vector<uint16_t> expected(embedding.size(), 0);
  for (size_t i = 0; i < embedding.size(); ++i) {
    embedding[i] = std::bit_cast<float>(cases[i % cases.size()].first);
    expected[i] = cases[i % cases.size()].second;
  }
  ASSERT_TRUE(WriteHfCheckpoint(dir_, config, SourceOf(values),
                                {.dtype = HfDType::kBF16})
                  .ok());
  EXPECT_EQ(RawBf16(Path(kHfWeightsFile), "model.embed_tokens.weight"),
            expected);
}

TEST_F(HfCheckpointTest, SourceIsAskedForEachTensorOnceInLayerOrder) {
  const HfLlamaConfig config = TinyConfig();
  const auto values = ModelValues(config);
  std::vector<std::string> requested;
  ASSERT_TRUE(
      WriteHfCheckpoint(dir_, config, SourceOf(values, &requested)).ok());
  std::vector<std::string> expected;
  for (const auto& [name, shape] : ExpectedLlamaTensors(config)) {
    expected.push_back(name);
  }
  EXPECT_EQ(requested, expected);
  EXPECT_EQ(requested.front(), "layers.0.weight");
  EXPECT_EQ(requested.back(), "layers.4.weight");
}

TEST_F(HfCheckpointTest, TiedModelWritesNoLmHeadAndReadsItFromEmbedding) {
  const HfLlamaConfig config = TinyConfig(kQwen2Architecture);
  const auto values = ModelValues(config);
  std::vector<std::string> requested;
  ASSERT_TRUE(WriteHfCheckpoint(dir_, config, SourceOf(values, &requested),
                                {.dtype = HfDType::kF32})
                  .ok());
  EXPECT_THAT(requested,
              ::testing::Not(::testing::Contains("layers.4.weight")));
  absl::StatusOr<engine::SafetensorsReader> reader =
      engine::SafetensorsReader::Open(Path(kHfWeightsFile));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->Find("lm_head.weight"), nullptr);
  EXPECT_NE(reader->Find("model.layers.1.self_attn.q_proj.bias"), nullptr);

  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->config().tie_word_embeddings);
  EXPECT_TRUE(ckpt->CheckComplete().ok()) << ckpt->CheckComplete();
  absl::StatusOr<std::vector<float>> head =
      ckpt->ReadConveyorTensor("layers.4.weight");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(*head, values.at("layers.0.weight"));
}

TEST_F(HfCheckpointTest, ExistingCheckpointIsReplacedOnlyWithOverwrite) {
  const HfLlamaConfig config = TinyConfig();
  auto values = ModelValues(config);
  ASSERT_TRUE(WriteHfCheckpoint(dir_, config, SourceOf(values)).ok());
  const std::string before = ReadText(Path(kHfWeightsFile));

  values["layers.3.weight"].assign(8, 2.0f);
  absl::Status again = WriteHfCheckpoint(dir_, config, SourceOf(values));
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Msg(again), Path(kHfConfigFile) +
                            ": already exists; set overwrite to replace the "
                            "checkpoint");
  EXPECT_EQ(ReadText(Path(kHfWeightsFile)), before);

  // Weights alone (a crash between the two files) also count.
  std::filesystem::remove(Path(kHfConfigFile));
  again = WriteHfCheckpoint(dir_, config, SourceOf(values));
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);

  ASSERT_TRUE(
      WriteHfCheckpoint(dir_, config, SourceOf(values), {.overwrite = true})
          .ok());
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT(*ckpt->ReadConveyorTensor("layers.3.weight"),
              ElementsAreArray(std::vector<float>(8, 2.0f)));
  EXPECT_THAT(ListDir(), ElementsAre("config.json", "model.safetensors"));
}

TEST_F(HfCheckpointTest, RefusesDirectoryHoldingShardedCheckpoint) {
  WriteText(kHfIndexFile, R"({"weight_map": {}})");
  const HfLlamaConfig config = TinyConfig();
  const auto values = ModelValues(config);
  const absl::Status written =
      WriteHfCheckpoint(dir_, config, SourceOf(values), {.overwrite = true});
  EXPECT_EQ(written.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Msg(written),
            dir_ +
                ": holds a sharded checkpoint "
                "(model.safetensors.index.json); remove it first: writing "
                "model.safetensors would leave its shards behind");
  EXPECT_THAT(ListDir(), ElementsAre(kHfIndexFile));
}

TEST_F(HfCheckpointTest, RefusesWrongValueCountAndWritesNothing) {
  const HfLlamaConfig config = TinyConfig();
  auto values = ModelValues(config);
  values["layers.2.mlp.down_proj.weight"].pop_back();
  const absl::Status written =
      WriteHfCheckpoint(dir_, config, SourceOf(values));
  EXPECT_EQ(written.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(written),
            "tensor \"layers.2.mlp.down_proj.weight\": the source gave 95 "
            "values; its shape [8, 12] holds 96");
  EXPECT_TRUE(ListDir().empty());
}

TEST_F(HfCheckpointTest, SourceErrorKeepsItsCodeAndNamesTheTensor) {
  const HfLlamaConfig config = TinyConfig();
  auto values = ModelValues(config);
  values.erase("layers.1.mlp.up_proj.weight");
  const absl::Status written =
      WriteHfCheckpoint(dir_, config, SourceOf(values));
  EXPECT_EQ(written.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Msg(written),
            "tensor \"layers.1.mlp.up_proj.weight\": no such tensor");
  EXPECT_TRUE(ListDir().empty());
}

TEST_F(HfCheckpointTest, RefusesInvalidConfigBeforeCreatingAnything) {
  HfLlamaConfig config = TinyConfig();
  config.attention_bias = true;  // Llama's would add an o_proj bias.
  const std::string dir = Path("new");
  const absl::Status written =
      WriteHfCheckpoint(dir, config, SourceOf(ModelValues(TinyConfig())));
  EXPECT_EQ(written.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(written),
              ::testing::StartsWith(dir + "/config.json: attention_bias: "));
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST_F(HfCheckpointTest, CreatesMissingParentsButRefusesAFile) {
  const HfLlamaConfig config = TinyConfig();
  const auto values = ModelValues(config);
  const std::string nested = Path("a/b/c");
  ASSERT_TRUE(WriteHfCheckpoint(nested, config, SourceOf(values)).ok());
  EXPECT_TRUE(HfCheckpoint::Open(nested).ok());

  WriteText("file", "x");
  const absl::Status written =
      WriteHfCheckpoint(Path("file"), config, SourceOf(values));
  EXPECT_EQ(written.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Msg(written), Path("file") + ": not a directory");
}

}  // namespace
}  // namespace conveyor::hf
