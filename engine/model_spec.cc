// Assembling a model spec (engine/model_spec.h): shape inference through
// each layer's row, parameter limits and tying, stage cuts, and the
// ModelSpec's queries over the assembled layers (parameters, FLOPs).
#include "engine/model_spec.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "engine/internal/model_spec_internal.h"
#include "engine/layer_kinds.h"
#include "engine/tensor.h"

namespace conveyor::engine {
namespace {

using model_spec_internal::ElementsCapped;

absl::Status InferLayer(LayerSpec& layer) {
  layer.output_shape = layer.input_shape;
  RETURN_IF_ERROR(LayerKindRowOf(layer.kind).infer(layer));
  if (ElementsCapped(layer.output_shape, kMaxSampleElements) >
      kMaxSampleElements) {
    return LayerError(
        layer, absl::StrCat("its output ", ShapeString(layer.output_shape),
                            " has more than ", kMaxSampleElements,
                            " elements per sample"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AssembleModel(std::vector<LayerSpec> layers,
                           const std::vector<int>& stage_begin,
                           ModelSpec* spec) {
  CONVEYOR_CHECK(!layers.empty() && !stage_begin.empty() && stage_begin[0] == 0,
                 "a model needs layers and a first stage at layer 0");
  spec->layers.clear();
  spec->stage_begin = stage_begin;
  spec->num_stages = static_cast<int>(stage_begin.size());
  std::vector<int64_t> shape = spec->input_shape;
  int64_t total_params = 0;
  int stage = 0;
  for (LayerSpec& layer : layers) {
    layer.index = static_cast<int>(spec->layers.size());
    while (stage + 1 < spec->num_stages &&
           stage_begin[stage + 1] <= layer.index) {
      ++stage;
    }
    layer.stage = stage;
    layer.input_shape = shape;
    layer.params.clear();
    RETURN_IF_ERROR(InferLayer(layer));
    if (layer.tied) {
      RETURN_IF_ERROR(TieToEmbedding(
          spec->layers.empty() ? nullptr : &spec->layers.front(), layer));
    }
    // Each parameter is below 2^50 elements (two dims <= 2^24, one of them
    // possibly tripled), so checking after every layer cannot overflow.
    for (const ParamSpec& p : layer.params) {
      if (!p.tied_copy) total_params += p.NumElements();
    }
    if (total_params > kMaxModelParams) {
      return LayerError(layer,
                        absl::StrCat("the model reaches ", total_params,
                                     " parameters here, above the limit of ",
                                     kMaxModelParams));
    }
    shape = layer.output_shape;
    spec->layers.push_back(std::move(layer));
  }
  spec->token_input = spec->layers.front().kind == LayerKind::kEmbedding;
  spec->output_shape = shape;
  return absl::OkStatus();
}

int ModelSpec::StageEnd(int stage) const {
  return stage + 1 < num_stages ? stage_begin[stage + 1]
                                : static_cast<int>(layers.size());
}

std::vector<const ParamSpec*> ModelSpec::Params() const {
  std::vector<const ParamSpec*> params;
  for (const LayerSpec& layer : layers) {
    for (const ParamSpec& p : layer.params) {
      if (!p.tied_copy) params.push_back(&p);
    }
  }
  return params;
}

std::vector<const ParamSpec*> ModelSpec::StageParams(int stage) const {
  std::vector<const ParamSpec*> params;
  for (int i = stage_begin[stage]; i < StageEnd(stage); ++i) {
    for (const ParamSpec& p : layers[i].params) params.push_back(&p);
  }
  return params;
}

std::vector<TiedParameter> ModelSpec::TiedParameters() const {
  std::vector<TiedParameter> tied;
  for (const LayerSpec& layer : layers) {
    for (const ParamSpec& p : layer.params) {
      if (!p.tied_copy) continue;
      // The original is the first layer's parameter of that name.
      int original = layer.stage;
      for (const LayerSpec& l : layers) {
        bool found = false;
        for (const ParamSpec& q : l.params) {
          found = found || (!q.tied_copy && q.name == p.name);
        }
        if (found) {
          original = l.stage;
          break;
        }
      }
      tied.push_back({.name = p.name,
                      .original_stage = original,
                      .copy_stage = layer.stage});
    }
  }
  return tied;
}

int64_t ModelSpec::NumParams() const {
  int64_t n = 0;
  for (const ParamSpec* p : Params()) n += p->NumElements();
  return n;
}

double ModelSpec::TrainingFlopsPerSample() const {
  double forward = 0;
  for (const LayerSpec& layer : layers) {
    if (layer.kind == LayerKind::kEmbedding) continue;  // Lookups.
    // Every position but the feature dimension takes the layer's matrices.
    double positions = 1;
    for (size_t d = 0; d + 1 < layer.input_shape.size(); ++d) {
      positions *= static_cast<double>(layer.input_shape[d]);
    }
    for (const ParamSpec& p : layer.params) {
      if (p.shape.size() == 2) {
        forward += 2.0 * static_cast<double>(p.NumElements()) * positions;
      }
    }
    const bool attends = layer.kind == LayerKind::kAttention ||
                         layer.kind == LayerKind::kTransformerBlock ||
                         layer.kind == LayerKind::kLlamaBlock;
    if (attends && layer.input_shape.size() == 2) {
      const double s = static_cast<double>(layer.input_shape[0]);
      const double width = static_cast<double>(
          layer.qkv_features > 0 ? layer.qkv_features : layer.input_shape[1]);
      forward += 4.0 * s * s * width;
    }
  }
  return 3.0 * forward;
}

absl::Status CheckStageBoundaries(const std::vector<int>& stage_begin,
                                  int num_layers) {
  if (stage_begin.empty()) {
    return absl::InvalidArgumentError("stage boundaries: no stages");
  }
  if (stage_begin[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage boundaries: the first stage begins at layer ",
                     stage_begin[0], ", not 0"));
  }
  if (static_cast<int64_t>(stage_begin.size()) > num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage boundaries: ", stage_begin.size(),
                     " stages for a model of ", num_layers, " layers"));
  }
  for (size_t s = 1; s < stage_begin.size(); ++s) {
    if (stage_begin[s] <= stage_begin[s - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage boundaries: stage ", s, " begins at layer ", stage_begin[s],
          ", not after stage ", s - 1, " (layer ", stage_begin[s - 1], ")"));
    }
    if (stage_begin[s] >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage boundaries: stage ", s, " begins at layer ", stage_begin[s],
          " but the model has ", num_layers, " layers"));
    }
  }
  return absl::OkStatus();
}

absl::Status SetStageBoundaries(ModelSpec* model,
                                const std::vector<int>& stage_begin) {
  RETURN_IF_ERROR(CheckStageBoundaries(stage_begin,
                                       static_cast<int>(model->layers.size())));
  model->stage_begin = stage_begin;
  model->num_stages = static_cast<int>(stage_begin.size());
  for (int s = 0; s < model->num_stages; ++s) {
    for (int i = stage_begin[s]; i < model->StageEnd(s); ++i) {
      model->layers[i].stage = s;
    }
  }
  return absl::OkStatus();
}

}  // namespace conveyor::engine
