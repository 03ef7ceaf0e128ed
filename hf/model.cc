#include "hf/model.h"

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"
#include "engine/layer_kinds.h"

namespace conveyor::hf {
namespace {

// config.json is a few KB.
constexpr uint64_t kMaxConfigBytes = uint64_t{1} << 20;

engine::LayerSpec Layer(engine::LayerKind kind, const engine::ModelSpec& spec,
                        absl::string_view what) {
  engine::LayerSpec layer;
  layer.kind = kind;
  layer.path = absl::StrCat("model.from_hf (", what, ")");
  layer.where = spec.from_hf_where;
  return layer;
}

absl::Status NotLlama(const engine::LayerSpec& layer,
                      absl::string_view message) {
  return engine::LayerError(
      layer, absl::StrCat("the model does not have the Llama layout "
                          "(embedding, llama_block x N, rmsnorm, lm_head): ",
                          message));
}

}  // namespace

absl::StatusOr<HfLlamaConfig> ReadHfLlamaConfig(const std::string& dir) {
  RETURN_IF_ERROR(CheckDirectory(dir, "HuggingFace checkpoint directory"));
  const std::string path =
      (std::filesystem::path(dir) / kHfConfigFile).string();
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path, kMaxConfigBytes));
  return ParseHfLlamaConfig(text, path);
}

absl::Status ExpandHfModel(const HfLlamaConfig& config,
                           engine::ModelSpec* spec) {
  const int64_t blocks = config.num_hidden_layers;
  const int64_t seq = spec->input_shape.at(0);
  auto error = [&](absl::string_view message) {
    return YamlError(spec->from_hf_where, "model.from_hf", message);
  };
  // Dynamic scaling is for sequences past max_position_embeddings.
  if (seq > config.max_position_embeddings &&
      config.rope_scaling.type != engine::RopeType::kDynamic) {
    return error(absl::StrCat("input_shape has ", seq,
                              " tokens, more than the checkpoint's "
                              "max_position_embeddings (",
                              config.max_position_embeddings, ")"));
  }
  std::vector<int> stage_begin = {0};
  for (int64_t block : spec->hf_boundaries) {
    if (block >= blocks) {
      return error(absl::StrCat("boundary ", block,
                                " is not a block where a stage can begin: the "
                                "checkpoint has ",
                                blocks, " blocks (0 to ", blocks - 1, ")"));
    }
    stage_begin.push_back(static_cast<int>(block + 1));  // after the embedding
  }

  std::vector<engine::LayerSpec> layers;
  engine::LayerSpec embed =
      Layer(engine::LayerKind::kEmbedding, *spec, "embed_tokens");
  embed.vocab_size = config.vocab_size;
  embed.features = config.hidden_size;
  layers.push_back(std::move(embed));
  for (int64_t i = 0; i < blocks; ++i) {
    engine::LayerSpec block = Layer(engine::LayerKind::kLlamaBlock, *spec,
                                    absl::StrCat("layers.", i));
    block.heads = config.num_attention_heads;
    block.kv_heads = config.num_key_value_heads;
    block.head_dim = config.head_dim();
    block.mlp_features = config.intermediate_size;
    block.eps = config.rms_norm_eps;
    block.rope_theta = config.rope_theta;
    block.rope_scaling = config.rope_scaling;
    block.bias = config.attention_bias;
    layers.push_back(std::move(block));
  }
  engine::LayerSpec norm = Layer(engine::LayerKind::kRmsNorm, *spec, "norm");
  norm.eps = config.rms_norm_eps;
  layers.push_back(std::move(norm));
  engine::LayerSpec head = Layer(engine::LayerKind::kLmHead, *spec, "lm_head");
  head.vocab_size = config.vocab_size;
  head.bias = false;
  // The last stage holds a copy of the embedding (engine::TiedParameter).
  head.tied = config.tie_word_embeddings;
  layers.push_back(std::move(head));

  RETURN_IF_ERROR(engine::AssembleModel(std::move(layers), stage_begin, spec));
  spec->hf_keys = {.architecture = config.architecture,
                   .max_position_embeddings = config.max_position_embeddings,
                   .token_ids = config.token_ids,
                   .torch_dtype = config.torch_dtype};
  spec->loss = engine::LossKind::kCrossEntropy;
  spec->target_shape = {seq};
  spec->integer_targets = true;
  return absl::OkStatus();
}

absl::StatusOr<HfLlamaConfig> HfConfigOfModel(const engine::ModelSpec& model,
                                              int64_t max_positions) {
  const std::vector<engine::LayerSpec>& layers = model.layers;
  if (layers.size() < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", layers.size(),
        " layers; the Llama layout is embedding, llama_block x N, rmsnorm, "
        "lm_head"));
  }
  const engine::LayerSpec& embed = layers.front();
  if (embed.kind != engine::LayerKind::kEmbedding || embed.max_positions > 0) {
    return NotLlama(embed,
                    "the first layer must be an embedding without "
                    "learned positions");
  }
  const engine::LayerSpec& first = layers[1];
  HfLlamaConfig config;
  config.hidden_size = embed.features;
  config.vocab_size = embed.vocab_size;
  config.num_hidden_layers = static_cast<int64_t>(layers.size()) - 3;
  config.num_attention_heads = first.heads;
  config.num_key_value_heads = first.kv_heads;
  // Stated only where features / heads does not give it.
  config.explicit_head_dim =
      embed.features % first.heads == 0 &&
              first.head_dim == embed.features / first.heads
          ? 0
          : first.head_dim;
  config.intermediate_size = first.mlp_features;
  config.rms_norm_eps = first.eps;
  config.rope_theta = first.rope_theta;
  config.rope_scaling = first.rope_scaling;
  config.attention_bias = first.bias;
  config.architecture =
      std::string(first.bias ? kQwen2Architecture : kLlamaArchitecture);
  config.max_position_embeddings =
      std::max(max_positions, model.input_shape.at(0));
  // Dynamic scaling grows theta past max_position_embeddings: it must be
  // the length the model's scaling starts at.
  if (first.rope_scaling.type == engine::RopeType::kDynamic) {
    config.max_position_embeddings =
        first.rope_scaling.original_max_position_embeddings;
  }
  // Imported: what its config.json said beyond the layers.
  const engine::HfImportedKeys& imported = model.hf_keys;
  if (!imported.architecture.empty()) {
    config.architecture = imported.architecture;
    config.max_position_embeddings = imported.max_position_embeddings;
    config.token_ids = imported.token_ids;
    config.torch_dtype = imported.torch_dtype;
  }
  config.model_type = std::string(ModelTypeFor(config.architecture));
  for (size_t i = 1; i + 2 < layers.size(); ++i) {
    const engine::LayerSpec& b = layers[i];
    if (b.kind != engine::LayerKind::kLlamaBlock) {
      return NotLlama(b,
                      "every layer between the embedding and the final "
                      "rmsnorm must be a llama_block");
    }
    if (b.heads != first.heads || b.kv_heads != first.kv_heads ||
        b.head_dim != first.head_dim || b.mlp_features != first.mlp_features ||
        b.eps != first.eps || b.rope_theta != first.rope_theta ||
        b.rope_scaling != first.rope_scaling || b.bias != first.bias) {
      return NotLlama(b, absl::StrCat("its options differ from the first "
                                      "llama_block's (layer 1); an HF config "
                                      "has one set for all blocks"));
    }
  }
  const engine::LayerSpec& norm = layers[layers.size() - 2];
  if (norm.kind != engine::LayerKind::kRmsNorm || norm.eps != first.eps) {
    return NotLlama(norm,
                    "the layer before lm_head must be an rmsnorm with "
                    "the blocks' eps");
  }
  const engine::LayerSpec& head = layers.back();
  if (head.kind != engine::LayerKind::kLmHead || head.bias ||
      head.vocab_size != embed.vocab_size) {
    return NotLlama(head,
                    "the last layer must be an lm_head without bias "
                    "over the embedding's vocabulary");
  }
  config.tie_word_embeddings = head.tied;
  RETURN_IF_ERROR(ValidateHfLlamaConfig(config, "the model"));
  return config;
}

absl::StatusOr<std::vector<float>> HfParameterSource::Read(
    const std::string& name, const engine::Shape& shape) const {
  ASSIGN_OR_RETURN(std::vector<float> values,
                   checkpoint_.ReadConveyorTensor(name));
  if (static_cast<int64_t>(values.size()) != engine::NumElements(shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        checkpoint_.dir(), ": tensor for ", name, " has ", values.size(),
        " elements; the model needs ", engine::ShapeString(shape)));
  }
  return values;
}

}  // namespace conveyor::hf
