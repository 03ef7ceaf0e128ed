// The model spec: the `model:` section of a job YAML, validated and expanded
// into the flat list of layers the engine builds, with every layer's
// per-sample input and output shape, its parameters (PyTorch names, shapes
// and init distributions) and the pipeline stage it belongs to.
//
//   model:
//     input_shape: [512]        # per sample
//     init: {seed: 0}           # or {from: params.safetensors}
//     remat: false              # optional
//     layers:
//       - dense: {features: 2048}
//       - relu
//       - boundary              # a pipeline stage boundary
//       - delay: {forward_ms: 2, backward_ms: 4}  # tests and benchmarks
//       - repeat: 4             # expands in place
//         boundary_every: 2     # optional
//         layers: [...]
//     loss: mse                 # or cross_entropy
//
// Everything the engine needs is resolved here (shapes, init bounds, stage
// assignment, parameter names) so that later code never re-derives it and a
// bad job fails at submission, before anything is allocated. The input is
// untrusted: every problem is an InvalidArgument of the form
//
//   job.yaml:7:9: model.layers[2].dense: unknown key 'feature'; allowed: ...
//
// (1-based line and column, then the YAML path), never an exception or a
// crash; limits below keep a typo or an alias bomb from exhausting memory.
//
// Thread-safety: the parse functions keep no state and may run concurrently,
// except on one shared YAML::Node tree: yaml-cpp updates internal caches even
// through a const Node, so give each thread its own tree (ParseModelSpecYaml
// always does). A ModelSpec is a plain value; concurrent const access is safe.
#ifndef CONVEYOR_ENGINE_MODEL_SPEC_H_
#define CONVEYOR_ENGINE_MODEL_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/yaml_reader.h"
#include "engine/loss_kind.h"
#include "yaml-cpp/yaml.h"

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

// The YAML name: "dense", "relu", "gelu", "layernorm", "embedding",
// "attention", "transformer_block", "lm_head", "rmsnorm", "llama_block",
// "delay".
absl::string_view LayerKindName(LayerKind kind);

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

// LossKind and LossKindName come from engine/loss_kind.h.

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
  int64_t vocab_size = 0;       // embedding, lm_head
  int64_t max_positions = 0;    // embedding; 0 = no learned positions
  int64_t heads = 0;            // attention, transformer_block, llama_block
  int64_t kv_heads = 0;         // llama_block: resolved (heads when not given)
  double rope_theta = 10000.0;  // llama_block
  bool causal = false;          // attention, transformer_block
  // attention, transformer_block: resolved width of q, k and v (the input
  // features when the YAML leaves it 0 or, for transformer_block, always).
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

struct ModelSpec {
  // Per sample. Integer token ids when token_input, else float.
  std::vector<int64_t> input_shape;
  // True when the first layer is an embedding.
  bool token_input = false;

  // init: exactly one of a seed or a safetensors file (path as written in the
  // YAML; the caller resolves it relative to whatever it chooses).
  std::optional<uint64_t> seed;
  std::string init_from;

  bool remat = false;
  LossKind loss = LossKind::kMse;

  // Expanded, without boundaries; layers[i].index == i.
  std::vector<LayerSpec> layers;
  // One more than the number of boundaries; every stage has >= 1 layer.
  int num_stages = 1;
  // stage_begin[s]: index of the first layer of stage s; stage_begin[0] == 0.
  std::vector<int> stage_begin = {0};

  // Per sample: the last layer's output, and what the loss compares it with.
  std::vector<int64_t> output_shape;
  std::vector<int64_t> target_shape;
  // cross_entropy takes integer class ids; mse float values.
  bool integer_targets = false;

  // One past the last layer index of `stage`.
  int StageEnd(int stage) const;
  // All parameters, in layer order. Pointers into `layers`.
  std::vector<const ParamSpec*> Params() const;
  // The parameters of the layers of `stage`, in layer order.
  std::vector<const ParamSpec*> StageParams(int stage) const;
  // Total parameter elements (<= kMaxModelParams).
  int64_t NumParams() const;
};

// Re-cuts `model` into stages beginning at `stage_begin` (stage_begin[0] ==
// 0, strictly increasing, every entry < model->layers.size()): sets
// num_stages, stage_begin and every layer's stage. Parameter names do not
// change (they follow the layer index). InvalidArgument for a malformed
// split, leaving *model unchanged.
absl::Status SetStageBoundaries(ModelSpec* model,
                                const std::vector<int>& stage_begin);

// Parses the value of a job's `model:` key. `file_name` prefixes errors.
// Returns InvalidArgument "file:line:col: path: message" for YAML it cannot
// accept: unknown, duplicate or missing keys, wrong types or values, unknown
// layer kinds, misplaced boundaries, shapes a layer cannot take, and specs
// over the limits above.
absl::StatusOr<ModelSpec> ParseModelSpec(const YAML::Node& model,
                                         absl::string_view file_name);

// Parses a YAML document whose top level is a map with a `model:` key (other
// top-level keys are ignored: the job parser owns them). For tests and tools.
// InvalidArgument as ParseModelSpec, plus YAML syntax errors with their
// position and a missing or duplicate `model:` key.
absl::StatusOr<ModelSpec> ParseModelSpecYaml(absl::string_view yaml_text,
                                             absl::string_view file_name);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_MODEL_SPEC_H_
