// The resolved description of one layer of a model: its kind and options,
// its per-sample input and output shapes, its parameters (PyTorch/HF names,
// shapes and init distributions) and its pipeline stage. The model spec
// (engine/model_spec.h) produces these from YAML through the layer-kind table
// (engine/layer_kinds.h), which also builds the engine's layer from one.
// Plain values; thread-safe for concurrent const access.
#ifndef CONVEYOR_ENGINE_LAYER_SPEC_H_
#define CONVEYOR_ENGINE_LAYER_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/yaml_reader.h"
#include "engine/rope.h"

namespace conveyor::engine {

// Upper bounds that turn an absurd spec into an error instead of an
// allocation failure or an endless expansion.
inline constexpr int64_t kMaxModelDimension = int64_t{1} << 24;
inline constexpr int kMaxInputRank = 8;
// Elements of one sample's activation at any layer boundary.
inline constexpr int64_t kMaxSampleElements = int64_t{1} << 34;
// Total parameter elements over the whole model.
inline constexpr int64_t kMaxModelParams = int64_t{1} << 34;
// Entries (layers and boundaries) in the expanded layer list.
inline constexpr int kMaxExpandedEntries = 100000;
inline constexpr int kMaxRepeatCount = kMaxExpandedEntries;
inline constexpr int kMaxRepeatNesting = 32;
// The longest a `delay` layer may wait in one action (one minute): more is a
// typo (seconds written as milliseconds), not a test.
inline constexpr double kMaxDelayMs = 60000.0;

// One per row of the layer-kind table (engine/layer_kinds.cc), which gives
// each its YAML name, options, shapes, parameters and construction.
enum class LayerKind {
  kDense,
  kRelu,
  kGelu,
  kLayerNorm,
  kEmbedding,
  kAttention,
  kTransformerBlock,
  kLmHead,
  // Llama-family (HF semantics and parameter names): RMS norm, and the
  // decoder block of grouped-query attention with rotary embedding and a
  // SwiGLU MLP (engine/layers/llama_block.h).
  kRmsNorm,
  kLlamaBlock,
  // Identity that takes a fixed time per action: a stand-in for compute of
  // known cost in tests and benchmarks (engine/layers/delay.h).
  kDelay,
};

// How a parameter is initialized from the seed (PyTorch's defaults for the
// corresponding module).
enum class ParamInit {
  kUniform,        // U(-bound, bound)
  kNormal,         // N(0, std^2)
  kXavierUniform,  // U(-bound, bound), bound = sqrt(6 / (fan_in + fan_out))
  kOnes,
  kZeros,
};

// "uniform", "normal", "xavier_uniform", "ones", "zeros".
absl::string_view ParamInitName(ParamInit init);

// Where a YAML node was, for errors reported after parsing (defined in
// common/yaml_reader.h, which reads the spec).
using ::conveyor::SourceLocation;

struct ParamSpec {
  // Full name as in a PyTorch state_dict: "layers.3.weight",
  // "layers.5.attn.in_proj_weight".
  std::string name;
  std::vector<int64_t> shape;
  ParamInit init = ParamInit::kZeros;
  // The resolved bound (kUniform, kXavierUniform) or standard deviation
  // (kNormal); 0 for kOnes and kZeros.
  double bound_or_std = 0.0;
  // A copy of the parameter of the same name that an earlier layer declares
  // (a tied lm_head's weight is the embedding's): initialized, loaded and
  // updated exactly as that one (the two gradients are summed before every
  // step), but counted, checkpointed and exported once, as the original.
  bool tied_copy = false;

  int64_t NumElements() const;
};

// One layer of the expanded list. Only the options of `kind` are meaningful;
// the others keep their defaults.
struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  // Position in the expanded list without boundaries: the <i> in parameter
  // names, so an MLP's names match an nn.Sequential of the same layers.
  int index = 0;
  int stage = 0;

  int64_t features = 0;  // dense, embedding: output features
  // dense, attention (true); lm_head, llama_block's q/k/v (false)
  bool bias = true;
  bool approximate_tanh = false;  // gelu, transformer_block
  // layernorm, transformer_block (1e-5); rmsnorm, llama_block (1e-6)
  double eps = 1e-5;
  int64_t vocab_size = 0;  // embedding, lm_head
  // lm_head: its weight is the first layer's (an embedding's), as a tied copy.
  bool tied = false;
  int64_t max_positions = 0;  // embedding; 0 = no learned positions
  int64_t heads = 0;          // attention, transformer_block, llama_block
  int64_t kv_heads = 0;       // llama_block: resolved (heads when not given)
  // llama_block: the size of one head, resolved (features / heads when not
  // given).
  int64_t head_dim = 0;
  double rope_theta = 10000.0;  // llama_block
  RopeScaling rope_scaling;     // llama_block (engine/rope.h)
  bool causal = false;          // attention, transformer_block
  // attention, transformer_block: resolved width of q, k and v (the input
  // features when the YAML leaves it 0 or, for transformer_block, always);
  // llama_block: the width of q, heads * head_dim (what attention's FLOPs
  // count).
  int64_t qkv_features = 0;
  int64_t mlp_features = 0;  // transformer_block, llama_block
  bool pre_norm = false;     // transformer_block: norm: pre
  // delay: the wait of each action, resolved from the YAML: BI takes
  // backward_ms, or backward_input_ms when the backward is split, and BW takes
  // 0 or backward_weight_ms. In [0, kMaxDelayMs].
  double forward_ms = 0.0;
  double backward_input_ms = 0.0;
  double backward_weight_ms = 0.0;

  // Per sample (no batch dimension).
  std::vector<int64_t> input_shape;
  std::vector<int64_t> output_shape;
  // In the order a PyTorch module registers them.
  std::vector<ParamSpec> params;

  // The YAML path ("model.layers[4].layers[0]"; shared by all repetitions of
  // a repeat) and the position of the layer's node.
  std::string path;
  SourceLocation where;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYER_SPEC_H_
