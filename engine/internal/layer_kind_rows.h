// The pieces of the layer-kind table (engine/layer_kinds.h) that its rows
// share, and each kind's row. The rows live in files by model family
// (engine/layer_kinds_basic.cc, layer_kinds_transformer.cc,
// layer_kinds_llama.cc); engine/layer_kinds.cc lists them in the table's
// order. The helpers follow PyTorch's parameter names and default inits, so
// that a layer's parameters match the module it mirrors.
//
// Not API: only engine/layer_kinds*.cc include this. Pure functions:
// thread-safe.
#ifndef CONVEYOR_ENGINE_INTERNAL_LAYER_KIND_ROWS_H_
#define CONVEYOR_ENGINE_INTERNAL_LAYER_KIND_ROWS_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/layer.h"
#include "engine/layer_kinds.h"
#include "engine/layer_spec.h"

namespace conveyor::engine::layer_kinds_internal {

using Built = absl::StatusOr<std::unique_ptr<Layer>>;

// "layers.<index>.": the prefix of the layer's parameter names.
std::string Prefix(const LayerSpec& layer);

// The input's last dimension (every shape has rank >= 1).
int64_t Features(const LayerSpec& layer);

ParamSpec MakeParam(absl::string_view prefix, absl::string_view name,
                    std::vector<int64_t> shape, ParamInit init,
                    double bound_or_std);

// PyTorch's default Linear init: kaiming_uniform(a=sqrt(5)) for the weight and
// U(±1/sqrt(fan_in)) for the bias reduce to the same bound.
double LinearBound(int64_t fan_in);

// torch.nn.Linear(in, out): weight [out, in], optional bias [out].
void AddLinearParams(absl::string_view prefix, int64_t in, int64_t out,
                     bool bias, std::vector<ParamSpec>& params);

// torch.nn.LayerNorm(d): weight ones, bias zeros.
void AddLayerNormParams(absl::string_view prefix, int64_t d,
                        std::vector<ParamSpec>& params);

// torch.nn.MultiheadAttention's parameters: in_proj_weight [3q, d] with
// xavier_uniform over the whole packed matrix, zero biases, out_proj as a
// Linear(q, d) with a zeroed bias.
void AddAttentionParams(absl::string_view prefix, int64_t d, int64_t q,
                        bool bias, std::vector<ParamSpec>& params);

// OK for a 2-D input [seq, features]; LayerError otherwise.
absl::Status NeedsSequence(const LayerSpec& layer);
// A block's check_shard: InvalidArgument at `layer` for the first of
// `counts` (its YAML key, its value) that `ranks` does not divide.
absl::Status CountsSplit(
    const LayerSpec& layer, int64_t ranks,
    std::initializer_list<std::pair<const char*, int64_t>> counts);

// A row's parse for a kind without options, and its infer for a kind whose
// output is its input's shape, with no parameters.
absl::Status NoOptions(const LayerOptions& options, LayerSpec& layer);
absl::Status SameShape(LayerSpec& layer);

// The keys of a kind whose one option is eps (layernorm, rmsnorm).
inline constexpr absl::string_view kEpsKeys[] = {"eps"};

// gelu's `approximate` option, which transformer_block takes too.
absl::Status ParseGelu(const LayerOptions& o, LayerSpec& l);

// The rows, one per kind (engine/layer_kinds_basic.cc).
LayerKindRow DenseRow();
LayerKindRow ReluRow();
LayerKindRow GeluRow();
LayerKindRow LayerNormRow();
LayerKindRow DelayRow();
// engine/layer_kinds_transformer.cc
LayerKindRow EmbeddingRow();
LayerKindRow AttentionRow();
LayerKindRow TransformerBlockRow();
LayerKindRow LmHeadRow();
// engine/layer_kinds_llama.cc
LayerKindRow RmsNormRow();
LayerKindRow LlamaBlockRow();

}  // namespace conveyor::engine::layer_kinds_internal

#endif  // CONVEYOR_ENGINE_INTERNAL_LAYER_KIND_ROWS_H_
