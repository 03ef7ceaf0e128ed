// Tensor names of a HuggingFace Llama-family checkpoint and their Conveyor
// counterparts. Conveyor's Llama model is the layer list
//
//   layers.0            embedding     model.embed_tokens.weight
//   layers.1..N         llama_block   model.layers.0..N-1.<suffix>
//   layers.N+1          rmsnorm       model.norm.weight
//   layers.N+2          lm_head       lm_head.weight
//
// where N is num_hidden_layers and a block's suffixes (input_layernorm.weight,
// self_attn.q_proj.weight, mlp.down_proj.weight, ...) are the same on both
// sides. The mapping checks only the layout (a known suffix, a block index
// below N); whether a tensor belongs to a given config (a bias, a tied
// lm_head) is ExpectedLlamaTensors' business.
//
// Thread-safety: pure functions.
#ifndef CONVEYOR_HF_NAMES_H_
#define CONVEYOR_HF_NAMES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hf/config.h"

namespace conveyor::hf {

// The Conveyor name of the HF tensor `hf_name` in a model of `num_blocks`
// decoder blocks. InvalidArgument "tensor \"<name>\" ...: <why>" for a name
// outside the layout, including a block index >= num_blocks or written with
// a sign or leading zeros.
absl::StatusOr<std::string> HfNameToConveyor(absl::string_view hf_name,
                                             int64_t num_blocks);

// The inverse: the HF name of the Conveyor parameter `conveyor_name`.
// InvalidArgument for a name outside the layout.
absl::StatusOr<std::string> ConveyorNameToHf(absl::string_view conveyor_name,
                                             int64_t num_blocks);

// True for tensors that old checkpoints carry but no model parameter
// corresponds to, and that loaders skip: "*.rotary_emb.inv_freq", the RoPE
// frequencies, which are recomputed from rope_theta.
bool IsIgnorableHfTensor(absl::string_view hf_name);

// Conveyor parameter names with their shapes, in layer order.
using TensorShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Every tensor a checkpoint of `config` stores, by Conveyor name, in layer
// order (within a block, in the order Conveyor's llama_block declares them).
// The q/k/v biases are listed only with attention_bias; the lm_head is left
// out when tie_word_embeddings is set, since the checkpoint does not store
// it (Conveyor's own model still has one: load it from the embedding).
// `config` should satisfy ValidateHfLlamaConfig.
TensorShapes ExpectedLlamaTensors(const HfLlamaConfig& config);

}  // namespace conveyor::hf

#endif  // CONVEYOR_HF_NAMES_H_
