// A HuggingFace Llama-family checkpoint as a Conveyor model, and back:
//   - the layer list its config.json describes (embedding, llama_block x N,
//     rmsnorm, lm_head), for a job's `model: {from_hf: DIR}`;
//   - its weights as a ParameterSource in Conveyor's names;
//   - the HF config of a Conveyor model of that layout, for
//     `conveyorctl export --format hf`.
// Thread-safety: pure functions; an HfParameterSource is as thread-safe as
// its HfCheckpoint (reads are serialized there).
#ifndef CONVEYOR_HF_MODEL_H_
#define CONVEYOR_HF_MODEL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model_spec.h"
#include "engine/parameter_source.h"
#include "hf/checkpoint.h"
#include "hf/config.h"

namespace conveyor::hf {

// Reads and parses DIR/config.json only (not the weights, which a job's
// parser does not need): NotFound, FailedPrecondition (not a directory) or
// InvalidArgument as HfCheckpoint::Open reports them.
absl::StatusOr<HfLlamaConfig> ReadHfLlamaConfig(const std::string& dir);

// Fills `spec` (parsed with from_hf set: input_shape [seq], hf_boundaries)
// with the layers of `config`: embedding (layers.0), llama_block for HF
// block i (layers.<i+1>), rmsnorm, lm_head; stages beginning at the blocks
// hf_boundaries names; cross_entropy over the vocabulary; the blocks with
// the config's head_dim, rope_theta and rope_scaling; spec->hf_keys with
// what the config says beyond the layers (architecture,
// max_position_embeddings, token ids, torch_dtype). InvalidArgument at
// from_hf's position for what the job asks that the checkpoint cannot
// give: a boundary outside [1, num_hidden_layers) or a sequence longer than
// max_position_embeddings (unless the rope scaling is dynamic, which is
// for such sequences). With tie_word_embeddings the lm_head is tied to the
// embedding (lm_head: {tied: true}).
absl::Status ExpandHfModel(const HfLlamaConfig& config,
                           engine::ModelSpec* spec);

// The HF config of a Conveyor model of the Llama layout (an embedding
// without learned positions, N llama_blocks alike, rmsnorm, an lm_head
// without bias, all of one width and vocabulary; the blocks' head_dim,
// rope_theta and rope_scaling alike), as kLlamaArchitecture, or
// kQwen2Architecture for q/k/v biases. max_position_embeddings is the
// model's sequence length unless `max_positions` is larger (for dynamic
// scaling, the length it starts at); tie_word_embeddings is the lm_head's
// `tied`; head_dim and rope_scaling are the blocks'. A model imported with
// from_hf gives back what its config.json said beyond the layers
// (model.hf_keys: the architecture, max_position_embeddings, the special
// token ids and torch_dtype), so that import then export round-trips.
// InvalidArgument naming the first layer that does not fit the layout.
absl::StatusOr<HfLlamaConfig> HfConfigOfModel(const engine::ModelSpec& model,
                                              int64_t max_positions = 0);

// The weights of an HF checkpoint by Conveyor name, converted to float,
// each checked against the shape the model asks for. `checkpoint` must
// outlive the source.
class HfParameterSource final : public engine::ParameterSource {
 public:
  explicit HfParameterSource(const HfCheckpoint& checkpoint)
      : checkpoint_(checkpoint) {}

  absl::StatusOr<std::vector<float>> Read(
      const std::string& name, const engine::Shape& shape) const override;

 private:
  const HfCheckpoint& checkpoint_;
};

}  // namespace conveyor::hf

#endif  // CONVEYOR_HF_MODEL_H_
