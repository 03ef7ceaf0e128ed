// The config.json of a HuggingFace Llama-family checkpoint, reduced to what
// Conveyor's Llama layout (embedding, llama_block x N, rmsnorm, lm_head) can
// represent exactly: LlamaForCausalLM, MistralForCausalLM without sliding
// windows and Qwen2ForCausalLM without sliding windows.
//
// Anything the layout cannot represent is refused rather than approximated:
// a checkpoint loaded with the wrong RoPE scaling, window or head size would
// run and quietly compute something else. RoPE scaling of HF's default,
// linear, dynamic, yarn and llama3 types and an explicit head_dim are
// represented (engine/rope.h). Of the keys that do not change the
// parameters or the forward pass, the special token ids and torch_dtype
// are kept for a round trip; the others (dropout, use_cache, ...) are
// ignored, as transformers ignores keys it does not know.
//
// Thread-safety: plain data and pure functions.
#ifndef CONVEYOR_HF_CONFIG_H_
#define CONVEYOR_HF_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model_spec.h"
#include "engine/rope.h"

namespace conveyor::hf {

// The largest dimension accepted (hidden_size, vocab_size, ...): far above
// any real model, far below where products of two of them overflow int64.
inline constexpr int64_t kMaxHfDimension = int64_t{1} << 24;

// The architectures accepted, with their model_type.
inline constexpr absl::string_view kLlamaArchitecture = "LlamaForCausalLM";
inline constexpr absl::string_view kMistralArchitecture = "MistralForCausalLM";
inline constexpr absl::string_view kQwen2Architecture = "Qwen2ForCausalLM";

// How tensors are stored in a written checkpoint ("torch_dtype").
enum class HfDType { kBF16, kF32 };

// "bfloat16", "float32".
absl::string_view TorchDTypeName(HfDType dtype);

struct HfLlamaConfig {
  // One of the k*Architecture names above.
  std::string architecture = std::string(kLlamaArchitecture);
  // "llama", "mistral" or "qwen2", matching `architecture`.
  std::string model_type = "llama";
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  // Resolved: num_attention_heads when config.json leaves it out or null.
  int64_t num_key_value_heads = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  // rope_scaling (or transformers 5's rope_parameters); kDefault for null.
  // For dynamic, original_max_position_embeddings is max_position_embeddings
  // (the length HF grows theta past); for yarn it defaults to it.
  engine::RopeScaling rope_scaling;
  // The head size when config.json states one other than hidden_size /
  // num_attention_heads (Qwen3, Gemma, Mistral-Nemo), or heads that do not
  // divide hidden_size; 0 otherwise. head_dim() resolves it.
  int64_t explicit_head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  // lm_head shares model.embed_tokens.weight and is not stored.
  bool tie_word_embeddings = false;
  // q/k/v projections carry biases (o_proj never does). Always true for
  // Qwen2ForCausalLM; always false for the others, since LlamaForCausalLM's
  // attention_bias also adds an o_proj bias that Conveyor's llama_block
  // does not have, and Mistral has no attention biases.
  bool attention_bias = false;
  // Always "silu" (SwiGLU).
  std::string hidden_act = "silu";
  // bos_token_id, eos_token_id (one or a list), pad_token_id: kept, used by
  // nothing here.
  engine::SpecialTokenIds token_ids;
  // torch_dtype as read ("" when absent). A written config states the dtype
  // it is written with instead (HfLlamaConfigJson).
  std::string torch_dtype;

  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim
                                 : hidden_size / num_attention_heads;
  }

  // Equal configs describe the same model: every field but torch_dtype,
  // which says how the tensors happened to be stored. (A new field must
  // join the comparison in config.cc.)
  bool operator==(const HfLlamaConfig& other) const;
};

// The model_type transformers expects for `architecture`, or "" if the
// architecture is not one of the supported ones.
absl::string_view ModelTypeFor(absl::string_view architecture);

// Checks that `config` is one Conveyor can represent (the same rules
// ParseHfLlamaConfig applies after reading the JSON). Returns
// InvalidArgument "<source>: <key>: <why>" for the first violation.
absl::Status ValidateHfLlamaConfig(const HfLlamaConfig& config,
                                   absl::string_view source);

// Parses a config.json. `file_name` prefixes every error, which reads
// "<file_name>: <key>: <why>; got <value>" (InvalidArgument), or
// "<file_name> is not valid JSON: ..." with the line and column. Keys
// absent from the file take transformers' default where the three
// architectures agree on one (num_key_value_heads, rms_norm_eps 1e-6,
// rope_theta 10000, tie_word_embeddings false, hidden_act silu, the
// attention biases); the sizes, vocab_size and max_position_embeddings are
// required. Refused: another architecture, a rope_type other than default,
// linear, dynamic, yarn and llama3 (or one missing the keys HF requires, or
// with values engine::CheckRopeScaling refuses), partial_rotary_factor other
// than 1, a sliding window in use, an odd head_dim, hidden_act other than
// silu, mlp_bias true, Llama's attention_bias true, sizes outside [1,
// kMaxHfDimension], heads that do not divide hidden_size into an even head
// size when head_dim is not given, kv heads that do not divide the heads,
// token ids that are not integers, and values of the wrong JSON type.
absl::StatusOr<HfLlamaConfig> ParseHfLlamaConfig(absl::string_view json_text,
                                                 absl::string_view file_name);

// A config.json for `config` that transformers' from_pretrained accepts
// (for the config's architecture) and ParseHfLlamaConfig parses back to
// `config` (but for torch_dtype, which states `dtype`): rope_scaling and
// head_dim included, and the special token ids when stated. `config`
// should satisfy ValidateHfLlamaConfig.
std::string HfLlamaConfigJson(const HfLlamaConfig& config, HfDType dtype);

}  // namespace conveyor::hf

#endif  // CONVEYOR_HF_CONFIG_H_
