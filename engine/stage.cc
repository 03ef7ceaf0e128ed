#include "engine/stage.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/init.h"
#include "engine/layer_kinds.h"

namespace conveyor::engine {
namespace {

InitRule RuleFor(const ParamSpec& p) {
  switch (p.init) {
    case ParamInit::kUniform:
    case ParamInit::kXavierUniform:
      return {InitRule::Kind::kUniform, p.bound_or_std};
    case ParamInit::kNormal:
      return {InitRule::Kind::kNormal, p.bound_or_std};
    case ParamInit::kOnes:
      return {InitRule::Kind::kOnes, 0};
    case ParamInit::kZeros:
      return {InitRule::Kind::kZeros, 0};
  }
  return {};
}

// Whether `built` is `whole`, or `whole` with one dimension divided by
// `ranks` (a tensor-parallel shard).
bool IsShardOf(const Shape& built, const Shape& whole, int ranks) {
  if (built == whole) return true;
  if (ranks <= 1 || built.size() != whole.size()) return false;
  int split = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    if (built[i] == whole[i]) continue;
    if (built[i] * ranks != whole[i]) return false;
    ++split;
  }
  return split == 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Stage>> Stage::Create(
    Backend* backend, const ModelSpec& spec, int stage,
    const TensorParallelRank& rank) {
  if (stage < 0 || stage >= spec.num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " is out of range: the model has ",
                     spec.num_stages, " stages"));
  }
  std::vector<std::unique_ptr<Layer>> layers;
  std::map<std::string, const ParamSpec*> specs;
  for (int i = spec.stage_begin[stage]; i < spec.StageEnd(stage); ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<Layer> layer,
                     BuildLayer(backend, spec.layers[i], rank));
    layers.push_back(std::move(layer));
    // A stage holding a tied parameter and its copy (a one-stage model
    // with a tied lm_head) has two parameters of one name and spec.
    for (const ParamSpec& p : spec.layers[i].params) specs.emplace(p.name, &p);
  }
  std::unique_ptr<Stage> s(new Stage(backend, stage, spec.remat,
                                     std::move(layers), std::move(specs)));
  // The layers and the spec must agree on every parameter's name and shape;
  // a mismatch is a bug in one of them, caught here rather than at init.
  std::set<std::string> built;
  for (Parameter* p : s->parameters()) {
    auto it = s->specs_.find(p->name);
    if (it == s->specs_.end() ||
        !IsShardOf(p->value.shape(), it->second->shape, rank.size())) {
      return absl::InternalError(absl::StrCat(
          "layer parameter ", p->name, " ", ShapeString(p->value.shape()),
          " does not match the model spec"));
    }
    built.insert(p->name);
  }
  if (built.size() != s->specs_.size()) {
    return absl::InternalError("the model spec lists parameters no layer has");
  }
  RETURN_IF_ERROR(AddGemmCopies(s->parameters()));
  return s;
}

absl::Status Stage::InitializeFromSeed(uint64_t seed) {
  for (Parameter* p : parameters()) {
    RETURN_IF_ERROR(InitializeParameter(
        backend_, seed, p->name, RuleFor(*specs_.at(p->name)), p->value));
  }
  RefreshGemmCopies(parameters());
  return absl::OkStatus();
}

Parameter* FindParameter(PipelineStage& stage, const std::string& name,
                         bool copy) {
  for (Parameter* p : stage.parameters()) {
    if (p->name == name && p->tied_copy == copy) return p;
  }
  return nullptr;
}

absl::Status CheckInitFileFitsModel(const SafetensorsReader& file,
                                    const ModelSpec& model) {
  for (const ParamSpec* p : model.Params()) {
    RETURN_IF_ERROR(CheckInitTensor(file, p->name, p->shape));
  }
  return absl::OkStatus();
}

absl::Status Stage::LoadFrom(const ParameterSource& source) {
  for (Parameter* p : parameters()) {
    ASSIGN_OR_RETURN(std::vector<float> values,
                     source.Read(p->name, p->value.shape()));
    if (static_cast<int64_t>(values.size()) != p->value.numel()) {
      return absl::InternalError(absl::StrCat(
          "parameter ", p->name, ": the source gave ", values.size(),
          " values for ", ShapeString(p->value.shape())));
    }
    RETURN_IF_ERROR(backend_->CopyFromHost(
        values.data(), values.size() * sizeof(float), p->value));
  }
  RefreshGemmCopies(parameters());
  return absl::OkStatus();
}

absl::StatusOr<Stage::MicrobatchState*> Stage::State(int microbatch,
                                                     const char* action) {
  auto it = states_.find(microbatch);
  if (it == states_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", index_, ": ", action, " of microbatch ",
                     microbatch, " before its forward"));
  }
  return &it->second;
}

absl::Status Stage::SetDocuments(int microbatch,
                                 MicrobatchDocuments documents) {
  if (documents.empty()) {
    pending_documents_.erase(microbatch);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(DeviceDocuments uploaded,
                   UploadDocuments(backend_, documents));
  pending_documents_[microbatch] = std::move(uploaded);
  return absl::OkStatus();
}

DeviceDocuments Stage::TakeDocuments(int microbatch) {
  auto it = pending_documents_.find(microbatch);
  if (it == pending_documents_.end()) return DeviceDocuments();
  DeviceDocuments documents = std::move(it->second);
  pending_documents_.erase(it);
  return documents;
}

absl::StatusOr<Tensor> Stage::Forward(int microbatch, const Tensor& x) {
  if (states_.count(microbatch)) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", index_, ": microbatch ", microbatch,
                     " is already in flight"));
  }
  MicrobatchState& state = states_[microbatch];
  state.documents = TakeDocuments(microbatch);
  const DocumentsScope documents(&state.documents);
  absl::StatusOr<Tensor> y;
  if (remat_) {
    // Run forward into a scratch stash that dies here; keep only the input.
    Stash scratch;
    y = chain_.Forward(x, scratch);
    state.input = x;
  } else {
    y = chain_.Forward(x, state.stash);
    state.stash_ready = true;
  }
  if (!y.ok()) {
    states_.erase(microbatch);
    return y.status();
  }
  NotePeak();
  return y;
}

absl::StatusOr<Tensor> Stage::Evaluate(int label, const Tensor& x) {
  const DeviceDocuments taken = TakeDocuments(label);
  const DocumentsScope documents(&taken);
  // The layers' stash dies here, and with it every activation but y.
  Stash scratch;
  return chain_.Forward(x, scratch);
}

absl::StatusOr<Tensor> Stage::BackwardInput(int microbatch, const Tensor& dy) {
  ASSIGN_OR_RETURN(MicrobatchState * state, State(microbatch, "backward"));
  if (state->input_backward_done) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", index_, ": second input backward of microbatch ",
                     microbatch));
  }
  // Layers read the documents in Forward (remat's below included) and keep
  // what their backward needs in the stash.
  const DocumentsScope documents(&state->documents);
  if (!state->stash_ready) {
    // Remat: rebuild the activations from the kept input.
    RETURN_IF_ERROR(chain_.Forward(state->input, state->stash).status());
    state->stash_ready = true;
  }
  ASSIGN_OR_RETURN(Tensor dx,
                   chain_.BackwardInput(dy, state->stash, !is_first()));
  // The peak is taken before the release: BI's inputs and BW's are all live
  // at this point.
  NotePeak();
  chain_.ReleaseForWeightBackward(state->stash);
  state->input_backward_done = true;
  return dx;
}

absl::Status Stage::BackwardWeight(int microbatch) {
  ASSIGN_OR_RETURN(MicrobatchState * state,
                   State(microbatch, "weight backward"));
  if (!state->input_backward_done) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", index_, ": weight backward of microbatch ",
                     microbatch, " before its input backward"));
  }
  // The chain reads each inner layer's output gradient from the stash.
  RETURN_IF_ERROR(chain_.BackwardWeight(Tensor(), state->stash));
  states_.erase(microbatch);  // Frees the microbatch's activations.
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Stage::Backward(int microbatch, const Tensor& dy) {
  ASSIGN_OR_RETURN(Tensor dx, BackwardInput(microbatch, dy));
  RETURN_IF_ERROR(BackwardWeight(microbatch));
  return dx;
}

size_t Stage::live_activation_bytes() const {
  size_t total = 0;
  for (const auto& [mb, state] : states_) {
    total += state.stash.bytes();
    if (state.input.defined()) total += state.input.bytes();
  }
  return total;
}

void Stage::NotePeak() {
  peak_bytes_ = std::max(peak_bytes_, live_activation_bytes());
}

}  // namespace conveyor::engine
