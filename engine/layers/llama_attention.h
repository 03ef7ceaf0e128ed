// LlamaAttention: HF's LlamaAttention (also Mistral's and Qwen2's): separate
// q, k, v and o projections, grouped-query attention (kv_heads dividing
// heads; each group of heads / kv_heads query heads shares one key and value
// head), rotary position embedding with HF's rotate_half convention on q and
// k (frequencies as HF's rope_scaling types compute them, engine/rope.h),
// and a causal mask. Input and output [B, S, d]; head_dim is d / heads
// unless given (Qwen3 and Gemma-style heads wider or narrower than that).
//
// Parameters, in HF's registration order: q_proj.weight [heads * head_dim, d],
// q_proj.bias, k_proj.weight [kv_heads * head_dim, d], k_proj.bias,
// v_proj.weight (as k), v_proj.bias, o_proj.weight [d, heads * head_dim]; the
// biases only with `bias` (Qwen2 has them, Llama does not). Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_LLAMA_ATTENTION_H_
#define CONVEYOR_ENGINE_LAYERS_LLAMA_ATTENTION_H_

#include <memory>
#include <string>

#include "engine/layer.h"
#include "engine/rope.h"

namespace conveyor::engine {

struct LlamaAttentionOptions {
  int64_t features = 0;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  // 0: features / heads.
  int64_t head_dim = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = {};
  bool bias = false;  // on q, k and v
};

class LlamaAttention final : public Layer {
 public:
  // InvalidArgument unless the head size is even (heads divides features
  // into one when head_dim is 0), kv_heads divides heads and the rope
  // scaling passes CheckRopeScaling.
  static absl::StatusOr<std::unique_ptr<LlamaAttention>> Create(
      Backend* backend, const std::string& prefix,
      const LlamaAttentionOptions& options);

  std::vector<Parameter*> parameters() override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;
  void ReleaseForWeightBackward(Stash& stash) override;

 private:
  LlamaAttention(Backend* backend, const LlamaAttentionOptions& o,
                 int64_t head_dim)
      : backend_(backend),
        o_(o),
        head_dim_(head_dim),
        rope_(o.rope_scaling, o.rope_theta, head_dim) {}

  Backend* backend_;
  LlamaAttentionOptions o_;
  int64_t head_dim_;
  RopeFrequencyCache rope_;
  Parameter q_, q_bias_, k_, k_bias_, v_, v_bias_, out_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_LLAMA_ATTENTION_H_
