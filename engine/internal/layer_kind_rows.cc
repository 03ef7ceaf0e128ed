// The parameter conventions and checks the layer-kind rows share
// (engine/internal/layer_kind_rows.h).
#include "engine/internal/layer_kind_rows.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tensor.h"

namespace conveyor::engine::layer_kinds_internal {

std::string Prefix(const LayerSpec& layer) {
  return absl::StrCat("layers.", layer.index, ".");
}

int64_t Features(const LayerSpec& layer) { return layer.input_shape.back(); }

ParamSpec MakeParam(absl::string_view prefix, absl::string_view name,
                    std::vector<int64_t> shape, ParamInit init,
                    double bound_or_std) {
  return ParamSpec{absl::StrCat(prefix, name), std::move(shape), init,
                   bound_or_std};
}

double LinearBound(int64_t fan_in) {
  return 1.0 / std::sqrt(static_cast<double>(fan_in));
}

void AddLinearParams(absl::string_view prefix, int64_t in, int64_t out,
                     bool bias, std::vector<ParamSpec>& params) {
  params.push_back(MakeParam(prefix, "weight", {out, in}, ParamInit::kUniform,
                             LinearBound(in)));
  if (bias) {
    params.push_back(
        MakeParam(prefix, "bias", {out}, ParamInit::kUniform, LinearBound(in)));
  }
}

void AddLayerNormParams(absl::string_view prefix, int64_t d,
                        std::vector<ParamSpec>& params) {
  params.push_back(MakeParam(prefix, "weight", {d}, ParamInit::kOnes, 0.0));
  params.push_back(MakeParam(prefix, "bias", {d}, ParamInit::kZeros, 0.0));
}

void AddAttentionParams(absl::string_view prefix, int64_t d, int64_t q,
                        bool bias, std::vector<ParamSpec>& params) {
  params.push_back(MakeParam(prefix, "in_proj_weight", {3 * q, d},
                             ParamInit::kXavierUniform,
                             std::sqrt(6.0 / static_cast<double>(d + 3 * q))));
  if (bias) {
    params.push_back(
        MakeParam(prefix, "in_proj_bias", {3 * q}, ParamInit::kZeros, 0.0));
  }
  params.push_back(MakeParam(prefix, "out_proj.weight", {d, q},
                             ParamInit::kUniform, LinearBound(q)));
  if (bias) {
    params.push_back(
        MakeParam(prefix, "out_proj.bias", {d}, ParamInit::kZeros, 0.0));
  }
}

absl::Status CountsSplit(
    const LayerSpec& layer, int64_t ranks,
    std::initializer_list<std::pair<const char*, int64_t>> counts) {
  std::string keys;
  for (const auto& [name, count] : counts) {
    absl::StrAppend(&keys, keys.empty() ? "" : ", ", name);
  }
  for (const auto& [name, count] : counts) {
    if (count % ranks != 0) {
      return LayerError(
          layer,
          absl::StrCat(name, " (", count, ") does not split over ", ranks,
                       " tensor-parallel ranks; "
                       "pipeline.tensor_parallel must divide ",
                       keys));
    }
  }
  return absl::OkStatus();
}

absl::Status NeedsSequence(const LayerSpec& layer) {
  const std::vector<int64_t>& in = layer.input_shape;
  if (in.size() == 2) return absl::OkStatus();
  return LayerError(
      layer,
      absl::StrCat("needs a 2-D input [seq, features]; got ", ShapeString(in),
                   in.size() == 1 ? " (start with an embedding, or give "
                                    "input_shape as [seq, features])"
                                  : ""));
}

absl::Status NoOptions(const LayerOptions&, LayerSpec&) {
  return absl::OkStatus();
}
absl::Status SameShape(LayerSpec&) { return absl::OkStatus(); }

}  // namespace conveyor::engine::layer_kinds_internal
