// Generator: autoregressive text generation, in process, for models of the
// Llama layout (embedding without learned positions, llama_block x N,
// rmsnorm, lm_head without bias over the embedding's vocabulary), with the
// semantics of HF's LlamaForCausalLM.
//
// Each block keeps a key/value cache of max_tokens positions, so a new token
// costs one row through every projection instead of the whole sequence
// again: feed the prompt at once, then each sampled token. The kernels are
// the Backend's, the ones the training layers use (engine/layers/
// llama_attention.cc), so the logits equal the training forward's up to the
// summation order of the GEMMs.
//
// Sampling is reproducible everywhere: the random stream is std::mt19937_64
// (whose output the standard fixes) turned into doubles by this code, not by
// a <random> distribution, whose algorithm each standard library picks.
//
// Thread-compatible: one thread drives a Generator (and its backend).
#ifndef CONVEYOR_ENGINE_GENERATE_H_
#define CONVEYOR_ENGINE_GENERATE_H_

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model_spec.h"
#include "engine/parameter_source.h"
#include "engine/tensor.h"

namespace conveyor::engine {

struct SamplingOptions {
  // Logits are divided by it before the softmax; 0 picks the most likely
  // token (greedy).
  double temperature = 1.0;
  // Sample among the k most likely tokens only; 0 = all, 1 = greedy.
  int64_t top_k = 0;
  uint64_t seed = 0;
};

// InvalidArgument unless temperature is finite and >= 0 and top_k >= 0.
absl::Status ValidateSamplingOptions(const SamplingOptions& options);

// One token id drawn from `logits` as `options` say (options.seed is not
// used: `rng` is the stream). Greedy (temperature 0 or top_k 1) takes the
// largest logit, the lowest id among equals, and draws nothing; otherwise
// one draw from softmax(logits / temperature) over the top_k largest
// (ties to the lower id). Errors: InvalidArgument for empty logits or bad
// options; FailedPrecondition for a logit that is NaN or infinite (the
// model's weights are not finite).
absl::StatusOr<int64_t> SampleToken(std::span<const float> logits,
                                    const SamplingOptions& options,
                                    std::mt19937_64& rng);

class Generator {
 public:
  // Loads the parameters of `model` from `params` onto `backend` and
  // allocates the caches for max_tokens positions. `backend` must outlive
  // the generator; `model` and `params` need not. Errors:
  //   InvalidArgument  a model not of the Llama layout (naming the first
  //                    layer that breaks it, engine::LayerError), or
  //                    max_tokens outside [1, kMaxModelDimension];
  //   the source's errors (a tensor missing or shaped otherwise) and the
  //   backend's (ResourceExhausted when the caches do not fit).
  static absl::StatusOr<std::unique_ptr<Generator>> Create(
      Backend* backend, const ModelSpec& model, const ParameterSource& params,
      int64_t max_tokens);

  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Appends `ids` at positions position() .. position() + ids.size() - 1
  // and returns the logits [vocab_size] of the last one. Errors, with
  // nothing appended: InvalidArgument for no ids or an id outside
  // [0, vocab_size); OutOfRange when the cache would pass max_tokens; the
  // backend's errors.
  absl::StatusOr<std::vector<float>> Feed(std::span<const int64_t> ids);

  // From an empty cache: feeds `prompt`, then draws new_tokens tokens, each
  // fed before the next is drawn, from one mt19937_64 stream seeded with
  // options.seed. Returns the new tokens (not the prompt). Needs
  // prompt.size() + new_tokens - 1 positions. Errors: InvalidArgument for
  // bad options, new_tokens < 0, an empty prompt or an id outside the
  // vocabulary; OutOfRange when the positions needed pass max_tokens
  // (checked before anything runs); Feed's and SampleToken's errors.
  absl::StatusOr<std::vector<int64_t>> Generate(std::span<const int64_t> prompt,
                                                int64_t new_tokens,
                                                const SamplingOptions& options);

  // Empties the cache (the next Feed is position 0).
  void Reset() { position_ = 0; }

  // Tokens in the cache.
  int64_t position() const { return position_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t vocab_size() const { return vocab_; }

 private:
  struct Block;

  Generator(Backend* backend, int64_t vocab, int64_t features,
            int64_t max_tokens);

  absl::Status CheckIds(std::span<const int64_t> ids) const;
  // Runs `ids` at position_ (which must be 0 unless there is one id: the
  // causal mask of the softmax kernel starts at the chunk's first row),
  // advances position_ past them and returns the last one's logits
  // [1, vocab].
  absl::StatusOr<Tensor> Step(std::span<const int64_t> ids);
  // x += attention(input_layernorm(x)), appending x's keys and values to
  // the block's cache at position_.
  absl::Status Attend(Block& block, const Tensor& x);
  // x += mlp(post_attention_layernorm(x)).
  absl::Status Mlp(const Block& block, const Tensor& x);

  Backend* backend_;
  int64_t vocab_;
  int64_t features_;
  int64_t max_tokens_;
  int64_t position_ = 0;
  Tensor embedding_;  // [vocab, d]
  std::vector<Block> blocks_;
  Tensor final_norm_;  // [d]
  float final_eps_ = 1e-6f;
  Tensor lm_head_;  // [vocab, d]
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_GENERATE_H_
