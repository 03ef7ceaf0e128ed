// Layer: one differentiable piece of a model, with forward and a backward
// split into the input gradient (BI) and the weight gradient (BW), so
// zero-bubble schedules can run them apart. A full backward is BI then BW.
//
// Per microbatch, Forward fills a Stash with what backward needs; BI may add
// to it what BW needs (composite layers keep their inner output gradients);
// BW accumulates into the parameters' grad tensors (+=), because a step sums
// over microbatches. The caller owns the stash and drops it after BW, which
// frees the activations. Layers are thread-compatible; one thread runs a
// stage.
#ifndef CONVEYOR_ENGINE_LAYER_H_
#define CONVEYOR_ENGINE_LAYER_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/tensor.h"

namespace conveyor::engine {

struct Parameter {
  std::string name;  // Global, e.g. "layers.3.weight".
  Tensor value;
  Tensor grad;  // Same shape; accumulated by BackwardWeight.
  // A copy of another layer's parameter of the same name, on its own stage
  // (ParamSpec::tied_copy): the optimizer steps it like any other, but the
  // gradient norm, checkpoints and exports leave it out.
  bool tied_copy = false;
  // Whether a layer passes the value to GEMMs (false: a lookup table, such
  // as an embedding's, which keeps no bf16 copy below).
  bool gemm_operand = true;
  // On a backend whose GEMMs take bf16 inputs (Backend::bf16_gemms): the
  // value rounded to bf16, made once whenever the value changes (the
  // optimizer's update, an initialization or load, a replica's copy;
  // RefreshGemmCopies) instead of on every GEMM call. Rounding is
  // idempotent, so GEMMs compute bit for bit what they did from `value`.
  Tensor value_bf16{};

  // The operand a layer's GEMMs take for this parameter.
  const Tensor& gemm_value() const {
    return value_bf16.defined() ? value_bf16 : value;
  }
};

// Gives each matrix parameter of `params` on a bf16_gemms backend its bf16
// copy (allocated here), as of its value now.
absl::Status AddGemmCopies(const std::vector<Parameter*>& params);
// Brings every parameter's bf16 copy up to date with its value (a no-op
// for those without one). Call after anything writes values.
void RefreshGemmCopies(const std::vector<Parameter*>& params);

// What one layer keeps between forward and backward for one microbatch.
struct Stash {
  std::vector<Tensor> saved;         // Forward activations.
  std::vector<Tensor> output_grads;  // Kept by BI for BW (composites).
  std::vector<Stash> children;       // Sublayers' stashes (composites).

  // Bytes held, counting a shared buffer once per tensor handle.
  size_t bytes() const;
};

class Layer {
 public:
  virtual ~Layer() = default;

  // The layer's parameters, in a fixed order. Pointers stay valid for the
  // layer's lifetime.
  virtual std::vector<Parameter*> parameters() { return {}; }

  // y = f(x) for one microbatch (leading dimension = samples).
  virtual absl::StatusOr<Tensor> Forward(const Tensor& x, Stash& stash) = 0;

  // dx from dy (dL/dy). With need_dx false (the stage's first layer on data)
  // the layer may skip computing dx and return an undefined tensor, but must
  // still record what BackwardWeight needs.
  virtual absl::StatusOr<Tensor> BackwardInput(const Tensor& dy, Stash& stash,
                                               bool need_dx) = 0;

  // grad += dL/dparams, from the same dy BackwardInput got.
  virtual absl::Status BackwardWeight(const Tensor& /*dy*/, Stash& /*stash*/) {
    return absl::OkStatus();
  }

  // Called after BackwardInput when BackwardWeight may run much later (a
  // zero-bubble schedule holds it back): frees what only BI needed, keeping
  // exactly what BW reads. A layer without parameters needs nothing for BW.
  // Layers with parameters keep everything unless they override this.
  virtual void ReleaseForWeightBackward(Stash& stash) {
    if (parameters().empty()) stash = Stash();
  }
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_LAYER_H_
