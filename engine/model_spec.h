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
//   model:                      # or a HuggingFace Llama-family checkpoint
//     from_hf: models/tinyllama # config.json + safetensors (hf/model.h)
//     input_shape: [256]        # tokens per sample
//     boundaries: [8, 16]       # optional: stages begin at these blocks
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
#include "engine/layer_kinds.h"
#include "engine/layer_spec.h"
#include "engine/loss_kind.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::engine {

// A parameter that two stages hold (ParamSpec::tied_copy): the original on
// `original_stage`, a copy on `copy_stage` (>= original_stage). Their
// gradients are summed before every optimizer step, so both take the same
// update and stay bitwise equal.
struct TiedParameter {
  std::string name;
  int original_stage = 0;
  int copy_stage = 0;

  friend bool operator==(const TiedParameter&, const TiedParameter&) = default;
};

// The special token ids of a vocabulary as an HF config.json states them
// (bos_token_id, eos_token_id, pad_token_id). eos may be one id or a list:
// Llama 3's instruct models list their end-of-turn ids.
struct SpecialTokenIds {
  std::optional<int64_t> bos = std::nullopt;
  std::vector<int64_t> eos = {};  // empty: none stated
  bool eos_is_list = false;       // stated as a list, even of one id
  std::optional<int64_t> pad = std::nullopt;

  bool operator==(const SpecialTokenIds&) const = default;
};

// What a model imported from HF (model.from_hf) keeps of its config.json
// beyond its layers, so that an export writes it back and a round trip
// gives the same config (hf::HfConfigOfModel, docs/jobs.md).
struct HfImportedKeys {
  // "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM".
  std::string architecture;
  int64_t max_position_embeddings = 0;
  SpecialTokenIds token_ids;
  // As stated ("bfloat16", "float16", ...); "" when the config has none.
  // An export states the dtype it writes.
  std::string torch_dtype;

  bool operator==(const HfImportedKeys&) const = default;
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

  // model.from_hf: a HuggingFace checkpoint directory (as written; the job
  // parser resolves it, reads its config.json and fills `layers`,
  // hf/model.h). The layers and the initial weights then come from the
  // checkpoint, and seed and init_from stay empty. Empty otherwise.
  std::string from_hf;
  // With from_hf: the block indices (0-based) where stages 1, 2, ... begin
  // (model.boundaries), and where from_hf was written, for errors.
  std::vector<int64_t> hf_boundaries;
  SourceLocation from_hf_where;
  // With from_hf: its config.json's keys an export writes back (empty
  // otherwise; hf::ExpandHfModel fills it).
  HfImportedKeys hf_keys;

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
  // All parameters, each once (no tied copies), in layer order: what
  // checkpoints, init files and exports hold. Pointers into `layers`.
  std::vector<const ParamSpec*> Params() const;
  // The parameters of the layers of `stage`, in layer order, tied copies
  // included: what the stage holds.
  std::vector<const ParamSpec*> StageParams(int stage) const;
  // Total parameter elements, each parameter once (<= kMaxModelParams).
  int64_t NumParams() const;
  // Model FLOPs of one training sample (forward and backward), the
  // numerator of model FLOPs utilisation: 2 per multiply-add of every
  // weight matrix at every position, plus attention's scores and weighted
  // sum (4 s^2 d per attention layer of sequence s and width d, counted
  // whole even when causal, as PaLM and Megatron count them); the backward
  // is twice the forward. Embedding lookups, norms and activations are not
  // counted, nor is recomputation (remat): the work the model needs, not
  // what this engine does.
  double TrainingFlopsPerSample() const;
  // The parameters held twice (a tied lm_head's weight is the embedding's):
  // the stage of the original and of the copy. Empty for most models.
  std::vector<TiedParameter> TiedParameters() const;
};

// Fills spec->layers from `layers` (each with its kind and options set, as
// its row's parse sets them, and a path and position for errors), cut into
// stages beginning at `stage_begin` (stage_begin[0] == 0, strictly
// increasing, each < layers.size()): runs each row's shape inference from
// spec->input_shape on, checks the limits, and sets the layers' indices,
// stages, shapes and parameters, num_stages, stage_begin, output_shape and
// token_input (not the loss's targets). ParseModelSpec runs it on the
// parsed list; models made in code (model.from_hf) call it directly.
// InvalidArgument "file:line:col: path: kind (layer i): ..." as
// ParseModelSpec reports a layer.
absl::Status AssembleModel(std::vector<LayerSpec> layers,
                           const std::vector<int>& stage_begin,
                           ModelSpec* spec);

// OK when `stage_begin` cuts a model of `num_layers` layers into stages:
// stage_begin[0] == 0, strictly increasing, every entry < num_layers.
// InvalidArgument "stage boundaries: ..." naming what is wrong otherwise.
absl::Status CheckStageBoundaries(const std::vector<int>& stage_begin,
                                  int num_layers);

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
