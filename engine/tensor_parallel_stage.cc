#include "engine/tensor_parallel_stage.h"

#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/internal/mesh_rows.h"
#include "engine/layer_kinds.h"

namespace conveyor::engine {
namespace {

// A tensor viewed as [outer, blocks, dims[dim] / blocks, inner]: slice r of
// `ranks` along `dim` is, in each of `outer` x `blocks` blocks, `length` =
// dims[dim] / (blocks x ranks) rows of `inner` floats.
struct SliceLayout {
  int64_t outer = 1, blocks = 1, block = 0, length = 0, inner = 1;

  SliceLayout(const Shape& whole_shape, int dim, int64_t stacked, int ranks)
      : blocks(stacked) {
    for (int i = 0; i < dim; ++i) outer *= whole_shape[i];
    for (size_t i = dim + 1; i < whole_shape.size(); ++i) {
      inner *= whole_shape[i];
    }
    block = whole_shape[dim] / blocks;
    length = block / ranks;
  }

  // Copies slice `r` of `whole_data` into `shard` (to_shard) or back.
  void Copy(float* whole_data, float* shard, int r, bool to_shard) const {
    const int64_t run = length * inner;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t b = 0; b < blocks; ++b) {
        float* w = whole_data + ((o * blocks + b) * block + r * length) * inner;
        float* s = shard + (o * blocks + b) * run;
        if (to_shard) {
          std::memcpy(s, w, run * sizeof(float));
        } else {
          std::memcpy(w, s, run * sizeof(float));
        }
      }
    }
  }
};

absl::Status ToHost(const Tensor& t, std::vector<float>& host) {
  host.resize(static_cast<size_t>(t.numel()));
  if (host.empty()) return absl::OkStatus();
  return t.backend()->CopyToHost(t, host.data(), host.size() * sizeof(float));
}

absl::Status FromHost(const std::vector<float>& host, const Tensor& t) {
  if (host.empty()) return absl::OkStatus();
  return t.backend()->CopyFromHost(host.data(), host.size() * sizeof(float), t);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorParallelStage>>
TensorParallelStage::Create(MeshCollective* collective, const ModelSpec& spec,
                            int stage, int tensor_parallel) {
  if (collective == nullptr || collective->size() < 1) {
    return absl::InvalidArgumentError("a tensor-parallel stage needs a mesh");
  }
  const int devices = collective->size();
  if (tensor_parallel < 1 || devices % tensor_parallel != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_parallel (", tensor_parallel,
                     ") must divide the mesh's devices (", devices, ")"));
  }
  RETURN_IF_ERROR(CheckTensorParallel(spec, tensor_parallel));
  ASSIGN_OR_RETURN(std::unique_ptr<Stage> master,
                   Stage::Create(collective->backend(0), spec, stage));
  std::vector<std::unique_ptr<TensorParallelGroup>> groups;
  for (int g = 0; g < devices / tensor_parallel; ++g) {
    ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelGroup> group,
                     CreateHostTensorParallelGroup(tensor_parallel));
    groups.push_back(std::move(group));
  }
  std::vector<std::unique_ptr<Stage>> ranks;
  for (int d = 0; d < devices; ++d) {
    ASSIGN_OR_RETURN(std::unique_ptr<Stage> rank,
                     Stage::Create(collective->backend(d), spec, stage,
                                   {.group = groups[d / tensor_parallel].get(),
                                    .rank = d % tensor_parallel}));
    ranks.push_back(std::move(rank));
  }
  // Layers list their parameters in one order whole or split; the names and
  // shapes tell which dimension each split.
  const std::vector<Parameter*> whole = master->parameters();
  const std::vector<Parameter*> shard = ranks[0]->parameters();
  if (whole.size() != shard.size()) {
    return absl::InternalError(
        absl::StrCat("stage ", stage, ": a rank's shard has ", shard.size(),
                     " parameters but the whole stage ", whole.size()));
  }
  // Each parameter's layer, whose kind says how its split dimension stacks.
  std::map<std::string, const LayerSpec*> layer_of;
  for (int l = spec.stage_begin[stage]; l < spec.StageEnd(stage); ++l) {
    for (const ParamSpec& p : spec.layers[l].params) {
      layer_of[p.name] = &spec.layers[l];
    }
  }
  std::vector<Split> splits(whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    const Shape& w = whole[i]->value.shape();
    const Shape& s = shard[i]->value.shape();
    if (whole[i]->name != shard[i]->name || w.size() != s.size()) {
      return absl::InternalError(
          absl::StrCat("stage ", stage, ": shard parameter ", shard[i]->name,
                       " is not whole parameter ", whole[i]->name));
    }
    if (whole[i]->value.dtype() != DType::kF32) {
      return absl::InternalError(absl::StrCat("stage ", stage, ": parameter ",
                                              whole[i]->name, " is not f32"));
    }
    for (size_t k = 0; k < w.size(); ++k) {
      if (w[k] != s[k]) splits[i].dim = static_cast<int>(k);
    }
    const auto layer = layer_of.find(whole[i]->name);
    const LayerKindRow* row = layer == layer_of.end()
                                  ? nullptr
                                  : &LayerKindRowOf(layer->second->kind);
    if (splits[i].dim >= 0 && row != nullptr && row->shard_blocks != nullptr) {
      splits[i].blocks = row->shard_blocks(whole[i]->name);
      if (w[splits[i].dim] % (splits[i].blocks * tensor_parallel) != 0) {
        return absl::InternalError(
            absl::StrCat("stage ", stage, ": parameter ", whole[i]->name,
                         " does not split into ", splits[i].blocks,
                         " blocks of ", tensor_parallel, " slices"));
      }
    }
  }
  return std::unique_ptr<TensorParallelStage>(new TensorParallelStage(
      collective, stage, tensor_parallel, std::move(master), std::move(groups),
      std::move(ranks), std::move(splits)));
}

TensorParallelStage::TensorParallelStage(
    MeshCollective* collective, int index, int tensor_parallel,
    std::unique_ptr<Stage> master,
    std::vector<std::unique_ptr<TensorParallelGroup>> groups,
    std::vector<std::unique_ptr<Stage>> ranks, std::vector<Split> splits)
    : collective_(collective),
      index_(index),
      tensor_parallel_(tensor_parallel),
      master_(std::move(master)),
      groups_(std::move(groups)),
      ranks_(std::move(ranks)),
      splits_(std::move(splits)),
      threads_(static_cast<int>(ranks_.size())) {}

absl::Status TensorParallelStage::InitializeFromSeed(uint64_t seed) {
  RETURN_IF_ERROR(master_->InitializeFromSeed(seed));
  return SliceParametersToRanks();
}

absl::Status TensorParallelStage::LoadFrom(const ParameterSource& source) {
  RETURN_IF_ERROR(master_->LoadFrom(source));
  return SliceParametersToRanks();
}

absl::Status TensorParallelStage::RunRanks(
    absl::FunctionRef<absl::Status(int)> fn) {
  const absl::Status status = threads_.Run(fn, [&](const absl::Status& why) {
    for (const auto& group : groups_) group->Abort(why);
  });
  for (const auto& group : groups_) group->Reset();
  return status;
}

absl::StatusOr<std::vector<Tensor>> TensorParallelStage::ToRanks(
    const Tensor& x, int microbatch, const char* what) {
  std::vector<int> leaders;
  for (int g = 0; g < replicas(); ++g) leaders.push_back(g * tensor_parallel_);
  ASSIGN_OR_RETURN(
      std::vector<Tensor> parts,
      SplitRows(*collective_, leaders, x, index_, microbatch, what));
  std::vector<Tensor> per_rank;
  per_rank.reserve(size());
  for (int d = 0; d < size(); ++d) {
    const Tensor& part = parts[d / tensor_parallel_];
    Backend* backend = collective_->backend(d);
    if (part.backend() == backend) {
      // Shared: layers never write their input.
      per_rank.push_back(part);
      continue;
    }
    ASSIGN_OR_RETURN(Tensor local, backend->Empty(part.shape(), part.dtype()));
    RETURN_IF_ERROR(collective_->Copy(part, local));
    per_rank.push_back(std::move(local));
  }
  return per_rank;
}

absl::StatusOr<Tensor> TensorParallelStage::FromReplicas(
    const std::vector<Tensor>& per_rank) {
  std::vector<Tensor> parts;
  for (int g = 0; g < replicas(); ++g) {
    parts.push_back(per_rank[g * tensor_parallel_]);
  }
  return ConcatRows(*collective_, parts, index_);
}

absl::Status TensorParallelStage::SetDocuments(int microbatch,
                                               MicrobatchDocuments documents) {
  const int n = replicas();
  if (documents.rows % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", index_, ": the documents of microbatch ", microbatch,
        " cover ", documents.rows, " rows, which do not split evenly over ", n,
        " replicas of the stage"));
  }
  const int64_t per = documents.rows / n;
  for (int d = 0; d < size(); ++d) {
    const int g = d / tensor_parallel_;
    RETURN_IF_ERROR(ranks_[d]->SetDocuments(
        microbatch, documents.Rows(g * per, (g + 1) * per)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> TensorParallelStage::Forward(int microbatch,
                                                    const Tensor& x) {
  ASSIGN_OR_RETURN(std::vector<Tensor> in, ToRanks(x, microbatch, "input"));
  std::vector<Tensor> out(size());
  RETURN_IF_ERROR(RunRanks([&](int d) -> absl::Status {
    ASSIGN_OR_RETURN(out[d], ranks_[d]->Forward(microbatch, in[d]));
    return absl::OkStatus();
  }));
  return FromReplicas(out);
}

absl::StatusOr<Tensor> TensorParallelStage::Evaluate(int label,
                                                     const Tensor& x) {
  ASSIGN_OR_RETURN(std::vector<Tensor> in, ToRanks(x, label, "input"));
  std::vector<Tensor> out(size());
  RETURN_IF_ERROR(RunRanks([&](int d) -> absl::Status {
    ASSIGN_OR_RETURN(out[d], ranks_[d]->Evaluate(label, in[d]));
    return absl::OkStatus();
  }));
  return FromReplicas(out);
}

absl::StatusOr<Tensor> TensorParallelStage::BackwardInput(int microbatch,
                                                          const Tensor& dy) {
  ASSIGN_OR_RETURN(std::vector<Tensor> in,
                   ToRanks(dy, microbatch, "output gradient"));
  std::vector<Tensor> out(size());
  RETURN_IF_ERROR(RunRanks([&](int d) -> absl::Status {
    ASSIGN_OR_RETURN(out[d], ranks_[d]->BackwardInput(microbatch, in[d]));
    return absl::OkStatus();
  }));
  // No input gradient on the first stage, nor for token ids.
  if (!out[0].defined()) return Tensor();
  return FromReplicas(out);
}

absl::Status TensorParallelStage::BackwardWeight(int microbatch) {
  return RunRanks([&](int d) { return ranks_[d]->BackwardWeight(microbatch); });
}

void TensorParallelStage::DropInFlight() {
  for (auto& rank : ranks_) rank->DropInFlight();
  for (const auto& group : groups_) group->Reset();
  ZeroRankGradients();
}

size_t TensorParallelStage::live_activation_bytes() const {
  size_t total = 0;
  for (const auto& rank : ranks_) total += rank->live_activation_bytes();
  return total;
}

size_t TensorParallelStage::peak_activation_bytes() const {
  size_t total = 0;
  for (const auto& rank : ranks_) total += rank->peak_activation_bytes();
  return total;
}

void TensorParallelStage::ResetPeakActivationBytes() {
  for (auto& rank : ranks_) rank->ResetPeakActivationBytes();
}

absl::Status TensorParallelStage::BeforeOptimizerStep() {
  const std::vector<Parameter*> whole = master_->parameters();
  const std::vector<std::vector<Parameter*>> by_rank = RankParameters();
  std::vector<float> sum, part, shard_sum;
  for (size_t i = 0; i < whole.size(); ++i) {
    const Split& split = splits_[i];
    sum.assign(static_cast<size_t>(whole[i]->grad.numel()), 0.0f);
    // Rank r's gradient summed over the replicas, in replica order.
    auto over_replicas = [&](int r, std::vector<float>& out) -> absl::Status {
      for (int g = 0; g < replicas(); ++g) {
        RETURN_IF_ERROR(
            ToHost(by_rank[g * tensor_parallel_ + r][i]->grad, part));
        if (g == 0) {
          out = part;
        } else {
          for (size_t k = 0; k < out.size(); ++k) out[k] += part[k];
        }
      }
      return absl::OkStatus();
    };
    if (split.dim < 0) {
      RETURN_IF_ERROR(over_replicas(0, sum));
    } else {
      const SliceLayout layout(whole[i]->grad.shape(), split.dim, split.blocks,
                               tensor_parallel_);
      for (int r = 0; r < tensor_parallel_; ++r) {
        RETURN_IF_ERROR(over_replicas(r, shard_sum));
        layout.Copy(sum.data(), shard_sum.data(), r, /*to_shard=*/false);
      }
    }
    RETURN_IF_ERROR(FromHost(sum, whole[i]->grad));
  }
  ZeroRankGradients();
  return absl::OkStatus();
}

absl::Status TensorParallelStage::AfterOptimizerStep() {
  return SliceParametersToRanks();
}

absl::Status TensorParallelStage::SliceParametersToRanks() {
  const std::vector<Parameter*> whole = master_->parameters();
  const std::vector<std::vector<Parameter*>> by_rank = RankParameters();
  std::vector<float> host, shard;
  for (size_t i = 0; i < whole.size(); ++i) {
    RETURN_IF_ERROR(ToHost(whole[i]->value, host));
    const Split& split = splits_[i];
    for (int d = 0; d < size(); ++d) {
      const Tensor& target = by_rank[d][i]->value;
      if (split.dim < 0) {
        RETURN_IF_ERROR(FromHost(host, target));
        continue;
      }
      shard.resize(static_cast<size_t>(target.numel()));
      const SliceLayout layout(whole[i]->value.shape(), split.dim, split.blocks,
                               tensor_parallel_);
      layout.Copy(host.data(), shard.data(), d % tensor_parallel_,
                  /*to_shard=*/true);
      RETURN_IF_ERROR(FromHost(shard, target));
    }
  }
  for (const auto& rank : ranks_) RefreshGemmCopies(rank->parameters());
  return absl::OkStatus();
}

std::vector<std::vector<Parameter*>> TensorParallelStage::RankParameters() {
  std::vector<std::vector<Parameter*>> by_rank;
  for (auto& rank : ranks_) by_rank.push_back(rank->parameters());
  return by_rank;
}

void TensorParallelStage::ZeroRankGradients() {
  for (int d = 0; d < size(); ++d) {
    for (Parameter* p : ranks_[d]->parameters()) {
      collective_->backend(d)->Fill(p->grad, 0.0f);
    }
  }
}

}  // namespace conveyor::engine
