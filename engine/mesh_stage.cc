#include "engine/mesh_stage.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/internal/mesh_rows.h"

namespace conveyor::engine {

absl::StatusOr<std::unique_ptr<MeshStage>> MeshStage::Create(
    MeshCollective* collective, const ModelSpec& spec, int stage) {
  if (collective == nullptr || collective->size() < 1) {
    return absl::InvalidArgumentError("a mesh stage needs a mesh");
  }
  std::vector<std::unique_ptr<Stage>> replicas;
  for (int d = 0; d < collective->size(); ++d) {
    ASSIGN_OR_RETURN(std::unique_ptr<Stage> replica,
                     Stage::Create(collective->backend(d), spec, stage));
    replicas.push_back(std::move(replica));
  }
  return std::unique_ptr<MeshStage>(
      new MeshStage(collective, stage, std::move(replicas)));
}

absl::Status MeshStage::InitializeFromSeed(uint64_t seed) {
  RETURN_IF_ERROR(replicas_[0]->InitializeFromSeed(seed));
  return BroadcastParameters();
}

absl::Status MeshStage::LoadFrom(const ParameterSource& source) {
  RETURN_IF_ERROR(replicas_[0]->LoadFrom(source));
  return BroadcastParameters();
}

absl::StatusOr<std::vector<Tensor>> MeshStage::Scatter(const Tensor& x,
                                                       int microbatch,
                                                       const char* what) {
  std::vector<int> devices(size());
  for (int d = 0; d < size(); ++d) devices[d] = d;
  return SplitRows(*collective_, devices, x, index_, microbatch, what);
}

absl::StatusOr<Tensor> MeshStage::Gather(const std::vector<Tensor>& parts) {
  return ConcatRows(*collective_, parts, index_);
}

absl::Status MeshStage::SetDocuments(int microbatch,
                                     MicrobatchDocuments documents) {
  const int n = size();
  if (documents.rows % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", index_, ": the documents of microbatch ",
                     microbatch, " cover ", documents.rows,
                     " rows, which do not split evenly over a "
                     "mesh of ",
                     n, " devices"));
  }
  const int64_t per = documents.rows / n;
  for (int d = 0; d < n; ++d) {
    RETURN_IF_ERROR(replicas_[d]->SetDocuments(
        microbatch, n == 1 ? std::move(documents)
                           : documents.Rows(d * per, (d + 1) * per)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> MeshStage::Forward(int microbatch, const Tensor& x) {
  ASSIGN_OR_RETURN(std::vector<Tensor> parts, Scatter(x, microbatch, "input"));
  std::vector<Tensor> outputs;
  outputs.reserve(parts.size());
  for (int d = 0; d < size(); ++d) {
    // A failure leaves the earlier replicas holding the microbatch; the
    // executor abandons the step and calls DropInFlight, which clears all.
    ASSIGN_OR_RETURN(Tensor y, replicas_[d]->Forward(microbatch, parts[d]));
    outputs.push_back(std::move(y));
  }
  return Gather(outputs);
}

absl::StatusOr<Tensor> MeshStage::Evaluate(int label, const Tensor& x) {
  ASSIGN_OR_RETURN(std::vector<Tensor> parts, Scatter(x, label, "input"));
  std::vector<Tensor> outputs;
  outputs.reserve(parts.size());
  for (int d = 0; d < size(); ++d) {
    ASSIGN_OR_RETURN(Tensor y, replicas_[d]->Evaluate(label, parts[d]));
    outputs.push_back(std::move(y));
  }
  return Gather(outputs);
}

absl::StatusOr<Tensor> MeshStage::BackwardInput(int microbatch,
                                                const Tensor& dy) {
  ASSIGN_OR_RETURN(std::vector<Tensor> parts,
                   Scatter(dy, microbatch, "output gradient"));
  std::vector<Tensor> grads;
  grads.reserve(parts.size());
  for (int d = 0; d < size(); ++d) {
    ASSIGN_OR_RETURN(Tensor dx,
                     replicas_[d]->BackwardInput(microbatch, parts[d]));
    grads.push_back(std::move(dx));
  }
  // The first stage has no input gradient (Stage returns an undefined
  // tensor), and neither does a stage whose input is token ids.
  if (!grads[0].defined()) return Tensor();
  return Gather(grads);
}

absl::Status MeshStage::BackwardWeight(int microbatch) {
  for (auto& replica : replicas_) {
    RETURN_IF_ERROR(replica->BackwardWeight(microbatch));
  }
  return absl::OkStatus();
}

void MeshStage::DropInFlight() {
  for (auto& replica : replicas_) replica->DropInFlight();
  ZeroOtherGradients();
}

size_t MeshStage::live_activation_bytes() const {
  size_t total = 0;
  for (const auto& replica : replicas_) {
    total += replica->live_activation_bytes();
  }
  return total;
}

size_t MeshStage::peak_activation_bytes() const {
  size_t total = 0;
  for (const auto& replica : replicas_) {
    total += replica->peak_activation_bytes();
  }
  return total;
}

void MeshStage::ResetPeakActivationBytes() {
  for (auto& replica : replicas_) replica->ResetPeakActivationBytes();
}

std::vector<std::vector<Tensor>> MeshStage::PerParameter(bool grads) {
  std::vector<std::vector<Parameter*>> by_replica;
  for (auto& replica : replicas_) by_replica.push_back(replica->parameters());
  std::vector<std::vector<Tensor>> per(by_replica[0].size());
  for (size_t i = 0; i < per.size(); ++i) {
    for (const auto& params : by_replica) {
      per[i].push_back(grads ? params[i]->grad : params[i]->value);
    }
  }
  return per;
}

absl::Status MeshStage::BeforeOptimizerStep() {
  if (size() == 1) return absl::OkStatus();
  RETURN_IF_ERROR(collective_->ReduceSumToFirst(PerParameter(/*grads=*/true)));
  ZeroOtherGradients();
  return absl::OkStatus();
}

absl::Status MeshStage::AfterOptimizerStep() { return BroadcastParameters(); }

absl::Status MeshStage::BroadcastParameters() {
  if (size() == 1) return absl::OkStatus();
  RETURN_IF_ERROR(
      collective_->BroadcastFromFirst(PerParameter(/*grads=*/false)));
  for (int d = 1; d < size(); ++d) {
    RefreshGemmCopies(replicas_[d]->parameters());
  }
  return absl::OkStatus();
}

void MeshStage::ZeroOtherGradients() {
  for (int d = 1; d < size(); ++d) {
    for (Parameter* p : replicas_[d]->parameters()) {
      collective_->backend(d)->Fill(p->grad, 0.0f);
    }
  }
}

}  // namespace conveyor::engine
