// A fresh directory per test and helpers that lay out HF checkpoints by hand
// (with the engine's safetensors writer, not the one under test); for the
// tests of hf/checkpoint.h.
#ifndef CONVEYOR_TESTS_HF_CHECKPOINT_TEST_BASE_H_
#define CONVEYOR_TESTS_HF_CHECKPOINT_TEST_BASE_H_

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/safetensors.h"
#include "gtest/gtest.h"
#include "hf/checkpoint.h"
#include "hf/config.h"
#include "hf/names.h"

namespace conveyor::hf {

inline std::string Msg(const absl::Status& status) {
  return std::string(status.message());
}

// One tensor of a hand-made shard.
struct RawTensor {
  std::string name;  // HF name.
  engine::DType dtype = engine::DType::kF32;
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
std::string BytesOf(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

inline std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return bits;
}

inline int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Two blocks of width 8 (4 heads of 2, 2 kv heads), vocab 10: every tensor
// shape is distinct enough that a mix-up changes a shape.
inline HfLlamaConfig TinyConfig(
    absl::string_view architecture = kLlamaArchitecture) {
  HfLlamaConfig c;
  c.architecture = std::string(architecture);
  c.model_type = std::string(ModelTypeFor(architecture));
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 10;
  c.max_position_embeddings = 16;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.attention_bias = architecture == kQwen2Architecture;
  c.tie_word_embeddings = architecture == kQwen2Architecture;
  return c;
}

// Distinct values per tensor, exactly representable in bf16 (at most 8
// significant bits), so that they survive any of the stored dtypes.
inline std::vector<float> TensorValues(size_t tensor_index, int64_t numel) {
  std::vector<float> values(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    values[static_cast<size_t>(i)] =
        static_cast<float>(tensor_index) + static_cast<float>(i % 16 - 8) / 8;
  }
  return values;
}

// TensorValues for every tensor of `config`, by Conveyor name.
inline std::map<std::string, std::vector<float>> ModelValues(
    const HfLlamaConfig& config) {
  std::map<std::string, std::vector<float>> values;
  size_t index = 0;
  for (const auto& [name, shape] : ExpectedLlamaTensors(config)) {
    values[name] = TensorValues(index++, Numel(shape));
  }
  return values;
}

// ModelValues as F32 tensors with HF names.
inline std::vector<RawTensor> ModelTensors(const HfLlamaConfig& config) {
  const auto values = ModelValues(config);
  std::vector<RawTensor> tensors;
  for (const auto& [name, shape] : ExpectedLlamaTensors(config)) {
    tensors.push_back({*ConveyorNameToHf(name, config.num_hidden_layers),
                       engine::DType::kF32, shape, BytesOf(values.at(name))});
  }
  return tensors;
}

class HfCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::path(::testing::TempDir()) / "hf_checkpoint_test" /
            ::testing::UnitTest::GetInstance()->current_test_info()->name())
               .string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  std::string Path(absl::string_view file) const {
    return absl::StrCat(dir_, "/", file);
  }

  void WriteText(absl::string_view file, const std::string& text) const {
    std::ofstream out(Path(file), std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << Path(file);
  }

  void WriteConfig(const HfLlamaConfig& config) const {
    WriteText(kHfConfigFile, HfLlamaConfigJson(config, HfDType::kF32));
  }

  void WriteShard(absl::string_view file,
                  const std::vector<RawTensor>& tensors) const {
    std::vector<engine::TensorToWrite> to_write;
    for (const RawTensor& t : tensors) {
      to_write.push_back(
          {t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
    }
    const absl::Status written =
        engine::WriteSafetensors(Path(file), to_write, {{"format", "pt"}});
    ASSERT_TRUE(written.ok()) << written;
  }

  // A complete single-file checkpoint of `config` (F32).
  void WriteSingleFile(const HfLlamaConfig& config) const {
    WriteConfig(config);
    WriteShard(kHfWeightsFile, ModelTensors(config));
  }

  std::vector<std::string> ListDir() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

}  // namespace conveyor::hf

#endif  // CONVEYOR_TESTS_HF_CHECKPOINT_TEST_BASE_H_
