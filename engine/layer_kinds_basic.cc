// The layer-kind rows of the basic kinds: dense (torch.nn.Linear), relu,
// gelu, layernorm (torch.nn.LayerNorm) and delay, an identity of known cost
// for tests and benchmarks.
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/internal/layer_kind_rows.h"
#include "engine/layer_kinds.h"
#include "engine/layers/activation.h"
#include "engine/layers/delay.h"
#include "engine/layers/dense.h"
#include "engine/layers/layer_norm.h"
#include "engine/tensor.h"

namespace conveyor::engine::layer_kinds_internal {

// gelu's option, which transformer_block takes too.
absl::Status ParseGelu(const LayerOptions& o, LayerSpec& l) {
  int approximate = l.approximate_tanh ? 1 : 0;
  RETURN_IF_ERROR(o.Enum("approximate", {"none", "tanh"}, approximate));
  l.approximate_tanh = approximate == 1;
  return absl::OkStatus();
}

namespace {

// --- dense: torch.nn.Linear -------------------------------------------------

constexpr absl::string_view kDenseKeys[] = {"features", "bias"};

absl::Status ParseDense(const LayerOptions& o, LayerSpec& l) {
  RETURN_IF_ERROR(o.Dim("features", true, 1, l.features));
  return o.Flag("bias", l.bias);
}

absl::Status InferDense(LayerSpec& l) {
  AddLinearParams(Prefix(l), Features(l), l.features, l.bias, l.params);
  l.output_shape.back() = l.features;
  return absl::OkStatus();
}

Built BuildDense(Backend* b, const LayerSpec& l) {
  return Dense::Create(b, Prefix(l), Features(l), l.features, l.bias);
}

// --- relu, gelu -------------------------------------------------------------

constexpr absl::string_view kGeluKeys[] = {"approximate"};

Built BuildRelu(Backend* b, const LayerSpec&) {
  return std::make_unique<Activation>(b, Activation::Kind::kRelu);
}

Built BuildGelu(Backend* b, const LayerSpec& l) {
  return std::make_unique<Activation>(b, l.approximate_tanh
                                             ? Activation::Kind::kGeluTanh
                                             : Activation::Kind::kGelu);
}

// --- layernorm: torch.nn.LayerNorm ------------------------------------------

absl::Status ParseLayerNorm(const LayerOptions& o, LayerSpec& l) {
  return o.Positive("eps", HUGE_VAL, l.eps);
}

absl::Status InferLayerNorm(LayerSpec& l) {
  AddLayerNormParams(Prefix(l), Features(l), l.params);
  return absl::OkStatus();
}

Built BuildLayerNorm(Backend* b, const LayerSpec& l) {
  return LayerNormLayer::Create(b, Prefix(l), Features(l),
                                static_cast<float>(l.eps));
}

// --- delay: an identity of known cost, for tests and benchmarks -------------

constexpr absl::string_view kDelayKeys[] = {
    "forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms"};

absl::Status ParseDelay(const LayerOptions& o, LayerSpec& l) {
  const YamlReader& reader = o.reader();
  const YamlMap& map = o.map();
  auto millis = [&](const YamlMapEntry& e) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(const double ms, reader.ParseNonNegativeDouble(e.value));
    if (ms > kMaxDelayMs) {
      return reader.Error(e.value, absl::StrCat("must be at most ", kMaxDelayMs,
                                                " (one minute); got ",
                                                DescribeYaml(e.value.node)));
    }
    return ms;
  };
  ASSIGN_OR_RETURN(const YamlMapEntry* forward,
                   reader.Require(map, "forward_ms"));
  ASSIGN_OR_RETURN(l.forward_ms, millis(*forward));
  const YamlMapEntry* backward = map.Find("backward_ms");
  const YamlMapEntry* input = map.Find("backward_input_ms");
  const YamlMapEntry* weight = map.Find("backward_weight_ms");
  // The backward is given whole or split, never both: with both, which one
  // B costs would be a guess.
  if (backward != nullptr && (input != nullptr || weight != nullptr)) {
    const YamlMapEntry& split = input != nullptr ? *input : *weight;
    return YamlError(split.key_where, split.value.path,
                     "give either backward_ms or the split backward "
                     "(backward_input_ms and backward_weight_ms), not both");
  }
  if (backward != nullptr) {
    ASSIGN_OR_RETURN(l.backward_input_ms, millis(*backward));
    l.backward_weight_ms = 0.0;
    return absl::OkStatus();
  }
  if (input == nullptr && weight == nullptr) {
    return reader.Error(map.self,
                        "missing required key 'backward_ms' (or "
                        "backward_input_ms and backward_weight_ms for a split "
                        "backward)");
  }
  if (input == nullptr || weight == nullptr) {
    return reader.Error(
        map.self,
        absl::StrCat(
            "a split backward needs both backward_input_ms and "
            "backward_weight_ms; missing '",
            input == nullptr ? "backward_input_ms" : "backward_weight_ms",
            "'"));
  }
  ASSIGN_OR_RETURN(l.backward_input_ms, millis(*input));
  ASSIGN_OR_RETURN(l.backward_weight_ms, millis(*weight));
  return absl::OkStatus();
}

Built BuildDelay(Backend*, const LayerSpec& l) {
  return std::make_unique<Delay>(l.forward_ms, l.backward_input_ms,
                                 l.backward_weight_ms);
}

}  // namespace

LayerKindRow DenseRow() {
  return {.kind = LayerKind::kDense,
          .name = "dense",
          .keys = kDenseKeys,
          .parse = ParseDense,
          .infer = InferDense,
          .build = BuildDense,
          .example = "- dense: {features: 8, bias: true}",
          .example_input = "[4, 6]"};
}

LayerKindRow ReluRow() {
  return {.kind = LayerKind::kRelu,
          .name = "relu",
          .keys = {},
          .parse = NoOptions,
          .infer = SameShape,
          .build = BuildRelu,
          .example = "- relu",
          .example_input = "[4, 6]"};
}

LayerKindRow GeluRow() {
  return {.kind = LayerKind::kGelu,
          .name = "gelu",
          .keys = kGeluKeys,
          .parse = ParseGelu,
          .infer = SameShape,
          .build = BuildGelu,
          .example = "- gelu: {approximate: tanh}",
          .example_input = "[4, 6]"};
}

LayerKindRow LayerNormRow() {
  return {.kind = LayerKind::kLayerNorm,
          .name = "layernorm",
          .keys = kEpsKeys,
          .parse = ParseLayerNorm,
          .infer = InferLayerNorm,
          .build = BuildLayerNorm,
          .example = "- layernorm: {eps: 1e-5}",
          .example_input = "[4, 6]"};
}

LayerKindRow DelayRow() {
  return {.kind = LayerKind::kDelay,
          .name = "delay",
          .keys = kDelayKeys,
          .parse = ParseDelay,
          .infer = SameShape,
          .build = BuildDelay,
          .example = "- delay: {forward_ms: 0, backward_ms: 0}",
          .example_input = "[4, 6]"};
}

}  // namespace conveyor::engine::layer_kinds_internal
