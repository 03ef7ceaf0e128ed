// Reading HF checkpoints: single-file and sharded layouts, tied embeddings,
// and hostile directories. Writing is in checkpoint_writer_test.cc.
#include "hf/checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint_test_base.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor::hf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST_F(HfCheckpointTest, OpensSingleFileAndReadsEveryTensor) {
  const HfLlamaConfig config = TinyConfig();
  WriteSingleFile(config);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->config(), config);
  EXPECT_EQ(ckpt->dir(), dir_);
  EXPECT_TRUE(ckpt->CheckComplete().ok()) << ckpt->CheckComplete();
  EXPECT_EQ(ckpt->TensorNames().size(), 1 + 2 * 9 + 2u);
  for (const auto& [name, values] : ModelValues(config)) {
    absl::StatusOr<std::vector<float>> read = ckpt->ReadConveyorTensor(name);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, values) << name;
  }
}

// Two shards as transformers' save_pretrained lays them out: the first
// block in one, the rest in the other, the second stored in BF16 and the
// final norm in F16.
class HfShardedCheckpointTest : public HfCheckpointTest {
 protected:
  void SetUp() override {
    HfCheckpointTest::SetUp();
    config_ = TinyConfig();
    WriteConfig(config_);
    std::vector<RawTensor> first;
    std::vector<RawTensor> second;
    for (RawTensor& t : ModelTensors(config_)) {
      if (t.name == "model.embed_tokens.weight" ||
          t.name.starts_with("model.layers.0.")) {
        first.push_back(std::move(t));
        continue;
      }
      if (t.name == "model.norm.weight") {
        // 1, -2, 0.5, 2^-24 (the smallest subnormal), 65504, -0, 1, 1.
        t.dtype = engine::DType::kF16;
        t.bytes = BytesOf<uint16_t>(
            {0x3c00, 0xc000, 0x3800, 0x0001, 0x7bff, 0x8000, 0x3c00, 0x3c00});
      } else {
        // TensorValues are exact in bf16: the top half of the f32 bits.
        std::vector<uint16_t> bf16;
        for (size_t i = 0; i < t.bytes.size(); i += 4) {
          uint32_t bits;
          std::memcpy(&bits, t.bytes.data() + i, 4);
          bf16.push_back(static_cast<uint16_t>(bits >> 16));
        }
        t.dtype = engine::DType::kBF16;
        t.bytes = BytesOf(bf16);
      }
      second.push_back(std::move(t));
    }
    WriteShard("model-00001-of-00002.safetensors", first);
    WriteShard("model-00002-of-00002.safetensors", second);
    nlohmann::json index;
    index["metadata"] = {{"total_size", 12345}};
    for (const RawTensor& t : first) {
      index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
    }
    for (const RawTensor& t : second) {
      index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
    }
    index_ = index;
    WriteText(kHfIndexFile, index.dump(2));
  }

  HfLlamaConfig config_;
  nlohmann::json index_;
};

TEST_F(HfShardedCheckpointTest, ReadsEveryTensorAcrossShardsAndDtypes) {
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->CheckComplete().ok()) << ckpt->CheckComplete();
  // Back and forth between the shards: the cache must follow.
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [name, values] : ModelValues(config_)) {
      absl::StatusOr<std::vector<float>> read = ckpt->ReadConveyorTensor(name);
      ASSERT_TRUE(read.ok()) << read.status();
      if (name == "layers.3.weight") {
        EXPECT_THAT(*read, ElementsAre(1.0f, -2.0f, 0.5f, 0x1p-24f, 65504.0f,
                                       -0.0f, 1.0f, 1.0f));
        EXPECT_TRUE(std::signbit((*read)[5]));
      } else {
        EXPECT_EQ(*read, values) << name;
      }
    }
  }
}

TEST_F(HfShardedCheckpointTest, ConcurrentReadsOfDifferentShardsAgree) {
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const auto values = ModelValues(config_);
  std::vector<int> mismatches(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      // One thread on each shard, so every read may evict the other's.
      const std::string name = t == 0 ? "layers.1.mlp.up_proj.weight"
                                      : "layers.2.mlp.up_proj.weight";
      for (int i = 0; i < 50; ++i) {
        absl::StatusOr<std::vector<float>> read =
            ckpt->ReadConveyorTensor(name);
        if (!read.ok() || *read != values.at(name)) ++mismatches[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0));
}

TEST_F(HfShardedCheckpointTest, RefusesShardNamesOutsideTheDirectory) {
  for (const char* shard : {"../model-00001-of-00002.safetensors", "..",
                            "sub/x.safetensors", "/etc/passwd", ""}) {
    nlohmann::json index = index_;
    index["weight_map"]["model.norm.weight"] = shard;
    WriteText(kHfIndexFile, index.dump());
    absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
    ASSERT_FALSE(ckpt.ok()) << shard;
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Msg(ckpt.status()),
              absl::StrCat(Path(kHfIndexFile),
                           ": weight_map: \"model.norm.weight\": shard file \"",
                           shard,
                           "\" is not a plain file name in the checkpoint "
                           "directory"));
  }
}

TEST_F(HfShardedCheckpointTest, RefusesMissingShard) {
  std::filesystem::remove(Path("model-00002-of-00002.safetensors"));
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Msg(ckpt.status()),
            Path("model-00002-of-00002.safetensors: missing, but "
                 "model.safetensors.index.json names it as a shard"));
}

TEST_F(HfShardedCheckpointTest, RefusesTensorInTwoShards) {
  // The second shard also holds the first shard's embedding.
  std::vector<RawTensor> second;
  for (RawTensor& t : ModelTensors(config_)) {
    if (t.name == "model.embed_tokens.weight" ||
        !t.name.starts_with("model.layers.0.")) {
      second.push_back(std::move(t));
    }
  }
  WriteShard("model-00002-of-00002.safetensors", second);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Msg(ckpt.status()),
      Path("model-00002-of-00002.safetensors: holds tensor "
           "\"model.embed_tokens.weight\", which "
           "model.safetensors.index.json's weight_map places in "
           "\"model-00001-of-00002.safetensors\" (a tensor in two shards, "
           "or an index that disagrees with them)"));
}

TEST_F(HfShardedCheckpointTest, RefusesTensorMissingFromItsShard) {
  nlohmann::json index = index_;
  index["weight_map"]["model.layers.0.self_attn.rotary_emb.inv_freq"] =
      "model-00001-of-00002.safetensors";
  WriteText(kHfIndexFile, index.dump());
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(ckpt.status()),
            Path("model-00001-of-00002.safetensors: has no tensor "
                 "\"model.layers.0.self_attn.rotary_emb.inv_freq\", which "
                 "model.safetensors.index.json's weight_map places there"));
}

TEST_F(HfShardedCheckpointTest, RefusesTensorNotInWeightMap) {
  nlohmann::json index = index_;
  index["weight_map"].erase("model.norm.weight");
  WriteText(kHfIndexFile, index.dump());
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(Msg(ckpt.status()),
            Path("model-00002-of-00002.safetensors: holds tensor "
                 "\"model.norm.weight\", which is not in "
                 "model.safetensors.index.json's weight_map"));
}

TEST_F(HfShardedCheckpointTest, RefusesMalformedIndex) {
  const std::pair<const char*, std::string> cases[] = {
      {"[]", ": must be a JSON object"},
      {"{}", ": weight_map: must be an object {tensor name: shard file}"},
      {R"({"weight_map": ["a"]})",
       ": weight_map: must be an object {tensor name: shard file}"},
      {R"({"weight_map": {"model.norm.weight": 3}})",
       ": weight_map: \"model.norm.weight\": must be a shard file name"},
  };
  for (const auto& [text, message] : cases) {
    WriteText(kHfIndexFile, text);
    absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
    ASSERT_FALSE(ckpt.ok()) << text;
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Msg(ckpt.status()), Path(kHfIndexFile) + message);
  }
  WriteText(kHfIndexFile, "{\"weight_map\": ");
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(Msg(ckpt.status()),
              StartsWith(Path(kHfIndexFile) + " is not valid JSON: "));
}

TEST_F(HfCheckpointTest, TiedModelReadsTheEmbeddingAsLmHead) {
  const HfLlamaConfig config = TinyConfig(kQwen2Architecture);
  ASSERT_TRUE(config.tie_word_embeddings);
  WriteSingleFile(config);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->CheckComplete().ok()) << ckpt->CheckComplete();
  EXPECT_THAT(
      ckpt->TensorNames(),
      ::testing::Not(::testing::Contains(std::string("lm_head.weight"))));
  absl::StatusOr<std::vector<float>> head =
      ckpt->ReadConveyorTensor("layers.4.weight");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(*head, ModelValues(config).at("layers.0.weight"));
  // The biases Qwen2 always has are there too.
  absl::StatusOr<std::vector<float>> bias =
      ckpt->ReadConveyorTensor("layers.2.self_attn.k_proj.bias");
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_EQ(bias->size(), 4u);
}

TEST_F(HfCheckpointTest, TiedCheckpointThatStoresLmHeadIsNotComplete) {
  const HfLlamaConfig config = TinyConfig(kQwen2Architecture);
  WriteConfig(config);
  std::vector<RawTensor> tensors = ModelTensors(config);
  tensors.push_back({"lm_head.weight",
                     engine::DType::kF32,
                     {10, 8},
                     BytesOf(std::vector<float>(80, 1.0f))});
  WriteShard(kHfWeightsFile, tensors);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(Msg(ckpt->CheckComplete()),
            dir_ +
                ": unexpected 1 tensor(s): \"lm_head.weight\" "
                "(tie_word_embeddings is true, so lm_head.weight should "
                "not be stored)");
}

TEST_F(HfCheckpointTest, RefusesBothLayoutsAndNeither) {
  const HfLlamaConfig config = TinyConfig();
  WriteConfig(config);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Msg(ckpt.status()),
            dir_ + ": no model.safetensors or model.safetensors.index.json");

  WriteText("pytorch_model.bin", "pickle");
  ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr("(pytorch_model.bin is not read: convert the "
                        "checkpoint to safetensors)"));

  WriteShard(kHfWeightsFile, ModelTensors(config));
  WriteText(kHfIndexFile, R"({"weight_map": {}})");
  ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(ckpt.status()),
            dir_ +
                ": holds both model.safetensors and "
                "model.safetensors.index.json; remove the one that is "
                "stale");
}

TEST_F(HfCheckpointTest, RefusesConfigJsonThatIsADirectory) {
  WriteShard(kHfWeightsFile, ModelTensors(TinyConfig()));
  std::filesystem::create_directory(Path(kHfConfigFile));
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(ckpt.status()), Path(kHfConfigFile) + ": not a regular file");
}

TEST_F(HfCheckpointTest, ReportsMissingConfigDirectoryAndNonDirectory) {
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ckpt.status()), StartsWith(Path(kHfConfigFile)));

  ckpt = HfCheckpoint::Open(Path("nope"));
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Msg(ckpt.status()),
            Path("nope") + ": no such checkpoint directory");

  WriteText("file", "x");
  ckpt = HfCheckpoint::Open(Path("file"));
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(HfCheckpointTest, BadConfigIsReportedWithItsPath) {
  HfLlamaConfig config = TinyConfig();
  WriteSingleFile(config);
  WriteText(kHfConfigFile, R"({"architectures": ["GPT2LMHeadModel"]})");
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              StartsWith(Path(kHfConfigFile) +
                         ": architectures: unsupported \"GPT2LMHeadModel\""));
}

TEST_F(HfCheckpointTest, RefusesTruncatedSafetensors) {
  WriteSingleFile(TinyConfig());
  const auto size = std::filesystem::file_size(Path(kHfWeightsFile));
  std::filesystem::resize_file(Path(kHfWeightsFile), size / 2);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()), StartsWith(Path(kHfWeightsFile)));
}

TEST_F(HfCheckpointTest, RefusesTensorWithTheWrongShape) {
  const HfLlamaConfig config = TinyConfig();
  WriteConfig(config);
  std::vector<RawTensor> tensors = ModelTensors(config);
  for (RawTensor& t : tensors) {
    // Transposed: same size, so only the shape check can catch it.
    if (t.name == "model.layers.1.mlp.up_proj.weight") t.shape = {8, 12};
  }
  WriteShard(kHfWeightsFile, tensors);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const std::string message =
      Path(kHfWeightsFile) +
      ": tensor \"model.layers.1.mlp.up_proj.weight\": shape [8, 12]; "
      "config.json implies [12, 8]";
  absl::StatusOr<std::vector<float>> read =
      ckpt->ReadConveyorTensor("layers.2.mlp.up_proj.weight");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(read.status()), message);
  EXPECT_EQ(Msg(ckpt->CheckComplete()), dir_ + ": " + message);
}

TEST_F(HfCheckpointTest, RefusesIntegerTensor) {
  const HfLlamaConfig config = TinyConfig();
  WriteConfig(config);
  std::vector<RawTensor> tensors = ModelTensors(config);
  for (RawTensor& t : tensors) {
    if (t.name == "model.norm.weight") {
      t.dtype = engine::DType::kI64;
      t.bytes = BytesOf<int64_t>({1, 1, 1, 1, 1, 1, 1, 1});
    }
  }
  WriteShard(kHfWeightsFile, tensors);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const std::string message = Path(kHfWeightsFile) +
                              ": tensor \"model.norm.weight\": dtype I64; "
                              "expected F32, F16 or BF16";
  absl::StatusOr<std::vector<float>> read =
      ckpt->ReadConveyorTensor("layers.3.weight");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(read.status()), message);
  EXPECT_EQ(Msg(ckpt->CheckComplete()), dir_ + ": " + message);
}

TEST_F(HfCheckpointTest, ReportsMissingAndUnexpectedTensors) {
  const HfLlamaConfig config = TinyConfig();
  WriteConfig(config);
  std::vector<RawTensor> tensors;
  for (RawTensor& t : ModelTensors(config)) {
    if (t.name != "model.layers.1.self_attn.v_proj.weight" &&
        t.name != "lm_head.weight") {
      tensors.push_back(std::move(t));
    }
  }
  // Old checkpoints carry the RoPE frequencies: ignorable. An o_proj bias
  // (Llama's attention_bias) is not.
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq",
                     engine::DType::kF32,
                     {1},
                     BytesOf<float>({1.0f})});
  tensors.push_back({"model.layers.0.self_attn.o_proj.bias",
                     engine::DType::kF32,
                     {8},
                     BytesOf(std::vector<float>(8, 0.0f))});
  WriteShard(kHfWeightsFile, tensors);
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(Msg(ckpt->CheckComplete()),
            dir_ +
                ": missing 2 tensor(s): "
                "\"model.layers.1.self_attn.v_proj.weight\", "
                "\"lm_head.weight\"; unexpected 1 tensor(s): "
                "\"model.layers.0.self_attn.o_proj.bias\"");
  absl::StatusOr<std::vector<float>> read =
      ckpt->ReadConveyorTensor("layers.2.self_attn.v_proj.weight");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Msg(read.status()),
            dir_ +
                ": tensor \"model.layers.1.self_attn.v_proj.weight\" "
                "(Conveyor \"layers.2.self_attn.v_proj.weight\") is not in "
                "the checkpoint");
}

TEST_F(HfCheckpointTest, ReadRefusesNamesThatAreNotParameters) {
  WriteSingleFile(TinyConfig());
  absl::StatusOr<HfCheckpoint> ckpt = HfCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<std::vector<float>> read =
      ckpt->ReadConveyorTensor("layers.7.weight");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(read.status()), StartsWith(dir_ + ": Conveyor tensor "
                                                    "\"layers.7.weight\""));
  // A bias is in the layout, but not in a Llama model without biases.
  read = ckpt->ReadConveyorTensor("layers.1.self_attn.q_proj.bias");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(read.status()),
            dir_ +
                ": \"layers.1.self_attn.q_proj.bias\" (HF "
                "\"model.layers.0.self_attn.q_proj.bias\") is not a "
                "parameter of this model (attention_bias is false)");
}

}  // namespace
}  // namespace conveyor::hf
