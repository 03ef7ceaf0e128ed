// The layer-kind rows of GPT-style transformers: embedding
// (torch.nn.Embedding, optionally with learned positions), attention
// (torch.nn.MultiheadAttention), transformer_block and lm_head.
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/internal/layer_kind_rows.h"
#include "engine/layer_kinds.h"
#include "engine/layers/attention.h"
#include "engine/layers/dense.h"
#include "engine/layers/embedding.h"
#include "engine/layers/transformer_block.h"
#include "engine/tensor.h"

namespace conveyor::engine::layer_kinds_internal {
namespace {

// --- embedding: torch.nn.Embedding, optionally with learned positions -------

constexpr absl::string_view kEmbeddingKeys[] = {"vocab_size", "features",
                                                "max_positions"};

absl::Status ParseEmbedding(const LayerOptions& o, LayerSpec& l) {
  RETURN_IF_ERROR(o.Dim("vocab_size", true, 1, l.vocab_size));
  RETURN_IF_ERROR(o.Dim("features", true, 1, l.features));
  return o.Dim("max_positions", false, 0, l.max_positions);
}

absl::Status InferEmbedding(LayerSpec& l) {
  const std::vector<int64_t>& in = l.input_shape;
  if (l.index != 0) {
    return LayerError(l,
                      "must be the first layer: it takes integer token ids, "
                      "and only the model's input is token ids");
  }
  if (in.size() != 1) {
    return LayerError(l, absl::StrCat("needs a 1-D input [seq] of token ids; "
                                      "got input_shape ",
                                      ShapeString(in)));
  }
  const int64_t seq = in[0];
  if (l.max_positions > 0 && seq > l.max_positions) {
    return LayerError(l, absl::StrCat("the input has ", seq,
                                      " positions, more than max_positions = ",
                                      l.max_positions));
  }
  const std::string prefix = Prefix(l);
  l.params.push_back(MakeParam(prefix, "weight", {l.vocab_size, l.features},
                               ParamInit::kNormal, 1.0));
  if (l.max_positions > 0) {
    l.params.push_back(MakeParam(prefix, "position.weight",
                                 {l.max_positions, l.features},
                                 ParamInit::kNormal, 1.0));
  }
  l.output_shape = {seq, l.features};
  return absl::OkStatus();
}

Built BuildEmbedding(Backend* b, const LayerSpec& l) {
  return Embedding::Create(b, Prefix(l), l.vocab_size, l.features,
                           l.max_positions);
}

// --- attention: torch.nn.MultiheadAttention as self-attention ---------------

constexpr absl::string_view kAttentionKeys[] = {"heads", "causal",
                                                "qkv_features", "bias"};

absl::Status ParseAttention(const LayerOptions& o, LayerSpec& l) {
  RETURN_IF_ERROR(o.Dim("heads", true, 1, l.heads));
  RETURN_IF_ERROR(o.Flag("causal", l.causal));
  RETURN_IF_ERROR(o.Dim("qkv_features", false, 0, l.qkv_features));
  return o.Flag("bias", l.bias);
}

absl::Status InferAttention(LayerSpec& l) {
  RETURN_IF_ERROR(NeedsSequence(l));
  if (l.qkv_features == 0) l.qkv_features = Features(l);
  if (l.qkv_features % l.heads != 0) {
    return LayerError(l,
                      absl::StrCat("qkv_features = ", l.qkv_features,
                                   " is not divisible by heads = ", l.heads));
  }
  AddAttentionParams(Prefix(l), Features(l), l.qkv_features, l.bias, l.params);
  return absl::OkStatus();
}

Built BuildAttention(Backend* b, const LayerSpec& l) {
  return SelfAttention::Create(b, Prefix(l), Features(l), l.heads,
                               l.qkv_features, l.causal, l.bias);
}

// --- transformer_block: the JaxPP notebook's block, post- or pre-norm -------

constexpr absl::string_view kBlockKeys[] = {
    "heads", "mlp_features", "causal", "norm", "eps", "approximate"};

absl::Status ParseTransformerBlock(const LayerOptions& o, LayerSpec& l) {
  RETURN_IF_ERROR(o.Dim("heads", true, 1, l.heads));
  RETURN_IF_ERROR(o.Dim("mlp_features", true, 1, l.mlp_features));
  RETURN_IF_ERROR(o.Flag("causal", l.causal));
  int norm = l.pre_norm ? 1 : 0;
  RETURN_IF_ERROR(o.Enum("norm", {"post", "pre"}, norm));
  l.pre_norm = norm == 1;
  RETURN_IF_ERROR(o.Positive("eps", HUGE_VAL, l.eps));
  return ParseGelu(o, l);
}

absl::Status InferTransformerBlock(LayerSpec& l) {
  RETURN_IF_ERROR(NeedsSequence(l));
  const int64_t d = Features(l);
  if (d % l.heads != 0) {
    return LayerError(l,
                      absl::StrCat("the input's features (", d,
                                   ") are not divisible by heads = ", l.heads));
  }
  l.qkv_features = d;
  const std::string prefix = Prefix(l);
  AddAttentionParams(prefix + "attn.", d, d, /*bias=*/true, l.params);
  AddLayerNormParams(prefix + "norm1.", d, l.params);
  AddLinearParams(prefix + "mlp.0.", d, l.mlp_features, /*bias=*/true,
                  l.params);
  AddLinearParams(prefix + "mlp.2.", l.mlp_features, d, /*bias=*/true,
                  l.params);
  AddLayerNormParams(prefix + "norm2.", d, l.params);
  return absl::OkStatus();
}

TransformerBlockOptions BlockOptions(const LayerSpec& l) {
  return {.features = Features(l),
          .heads = l.heads,
          .mlp_features = l.mlp_features,
          .causal = l.causal,
          .pre_norm = l.pre_norm,
          .eps = static_cast<float>(l.eps),
          .gelu_tanh = l.approximate_tanh};
}

Built BuildTransformerBlock(Backend* b, const LayerSpec& l) {
  return MakeTransformerBlock(b, Prefix(l), BlockOptions(l));
}

Built BuildTransformerBlockShard(Backend* b, const LayerSpec& l,
                                 const TensorParallelRank& rank) {
  TransformerBlockOptions options = BlockOptions(l);
  options.tensor_parallel = rank;
  return MakeTransformerBlock(b, Prefix(l), options);
}

absl::Status CheckTransformerBlockShard(const LayerSpec& l, int64_t ranks) {
  return CountsSplit(l, ranks,
                     {{"heads", l.heads}, {"mlp_features", l.mlp_features}});
}

// in_proj stacks q, k and v: each rank takes its heads' rows of all three.
int64_t TransformerBlockShardBlocks(absl::string_view name) {
  return absl::EndsWith(name, "attn.in_proj_weight") ||
                 absl::EndsWith(name, "attn.in_proj_bias")
             ? 3
             : 1;
}

// --- lm_head: a Linear to the vocabulary, without bias by default -----------
// tied: true makes its weight the embedding's (HF's tie_word_embeddings),
// held by its stage as a tied copy (TieToEmbedding).

constexpr absl::string_view kLmHeadKeys[] = {"vocab_size", "bias", "tied"};

absl::Status ParseLmHead(const LayerOptions& o, LayerSpec& l) {
  l.bias = false;
  RETURN_IF_ERROR(o.Dim("vocab_size", true, 1, l.vocab_size));
  RETURN_IF_ERROR(o.Flag("bias", l.bias));
  return o.Flag("tied", l.tied);
}

absl::Status InferLmHead(LayerSpec& l) {
  if (l.tied && l.bias) {
    return LayerError(l,
                      "tied: true shares the embedding's weight, and an "
                      "embedding has no bias to share: drop bias: true");
  }
  // A tied head's parameter is the embedding's, which TieToEmbedding adds
  // once the model's first layer is known.
  if (!l.tied) {
    AddLinearParams(Prefix(l), Features(l), l.vocab_size, l.bias, l.params);
  }
  l.output_shape.back() = l.vocab_size;
  return absl::OkStatus();
}

Built BuildLmHead(Backend* b, const LayerSpec& l) {
  if (l.tied) {
    return Dense::CreateTiedCopy(b, l.params.at(0).name, Features(l),
                                 l.vocab_size);
  }
  return Dense::Create(b, Prefix(l), Features(l), l.vocab_size, l.bias);
}

}  // namespace

LayerKindRow EmbeddingRow() {
  return {.kind = LayerKind::kEmbedding,
          .name = "embedding",
          .keys = kEmbeddingKeys,
          .parse = ParseEmbedding,
          .infer = InferEmbedding,
          .build = BuildEmbedding,
          .example =
              "- embedding: {vocab_size: 50, features: 8, max_positions: 16}",
          .example_input = "[12]"};
}

LayerKindRow AttentionRow() {
  return {.kind = LayerKind::kAttention,
          .name = "attention",
          .keys = kAttentionKeys,
          .parse = ParseAttention,
          .infer = InferAttention,
          .build = BuildAttention,
          .example = "- attention: {heads: 2, qkv_features: 12, causal: true}",
          .example_input = "[5, 8]"};
}

LayerKindRow TransformerBlockRow() {
  return {
      .kind = LayerKind::kTransformerBlock,
      .name = "transformer_block",
      .keys = kBlockKeys,
      .parse = ParseTransformerBlock,
      .infer = InferTransformerBlock,
      .build = BuildTransformerBlock,
      .example = "- transformer_block: {heads: 2, mlp_features: 16, norm: pre}",
      .example_input = "[5, 8]",
      .build_shard = BuildTransformerBlockShard,
      .check_shard = CheckTransformerBlockShard,
      .shard_blocks = TransformerBlockShardBlocks};
}

LayerKindRow LmHeadRow() {
  return {.kind = LayerKind::kLmHead,
          .name = "lm_head",
          .keys = kLmHeadKeys,
          .parse = ParseLmHead,
          .infer = InferLmHead,
          .build = BuildLmHead,
          .example = "- lm_head: {vocab_size: 50}",
          .example_input = "[5, 8]"};
}

}  // namespace conveyor::engine::layer_kinds_internal
