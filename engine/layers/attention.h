// SelfAttention: multi-head self-attention with torch.nn.MultiheadAttention's
// parameters: in_proj_weight [3Q, d] (q, k, v stacked), in_proj_bias [3Q],
// out_proj.weight [d, Q], out_proj.bias [d], where Q = heads * head_dim.
// Input and output [B, S, d]; optional causal mask. Thread-compatible.
#ifndef CONVEYOR_ENGINE_LAYERS_ATTENTION_H_
#define CONVEYOR_ENGINE_LAYERS_ATTENTION_H_

#include <memory>
#include <string>

#include "engine/layer.h"

namespace conveyor::engine {

class SelfAttention final : public Layer {
 public:
  // qkv_features (Q) must be a multiple of heads. With `bias`, in_proj_bias
  // and, unless `out_bias` is false, out_proj.bias (a tensor-parallel shard
  // leaves the latter to be added once after its all-reduce).
  static absl::StatusOr<std::unique_ptr<SelfAttention>> Create(
      Backend* backend, const std::string& prefix, int64_t features,
      int64_t heads, int64_t qkv_features, bool causal, bool bias,
      bool out_bias = true);

  std::vector<Parameter*> parameters() override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) override;
  absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                       bool need_dx) override;
  absl::Status BackwardWeight(const Tensor& dy, Stash& stash) override;
  void ReleaseForWeightBackward(Stash& stash) override;

 private:
  SelfAttention(Backend* backend, int64_t features, int64_t heads,
                int64_t qkv_features, bool causal, bool bias, bool out_bias)
      : backend_(backend),
        features_(features),
        heads_(heads),
        qkv_features_(qkv_features),
        causal_(causal),
        bias_(bias),
        out_bias_on_(bias && out_bias) {}

  Backend* backend_;
  int64_t features_, heads_, qkv_features_;
  bool causal_, bias_, out_bias_on_;
  Parameter in_weight_, in_bias_, out_weight_, out_bias_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYERS_ATTENTION_H_
