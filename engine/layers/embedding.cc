#include "engine/layers/embedding.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/documents.h"
#include "engine/layers/dense.h"

namespace conveyor::engine {

absl::StatusOr<std::unique_ptr<Embedding>> Embedding::Create(
    Backend* backend, const std::string& prefix, int64_t vocab,
    int64_t features, int64_t max_positions) {
  std::unique_ptr<Embedding> e(new Embedding(backend, features, max_positions));
  ASSIGN_OR_RETURN(
      e->weight_, MakeParameter(backend, prefix + "weight", {vocab, features}));
  if (max_positions > 0) {
    ASSIGN_OR_RETURN(e->position_,
                     MakeParameter(backend, prefix + "position.weight",
                                   {max_positions, features}));
  }
  // Looked up, never multiplied: no bf16 copies (a tied head multiplies
  // its own copy of the table).
  e->weight_.gemm_operand = false;
  e->position_.gemm_operand = false;
  return e;
}

std::vector<Parameter*> Embedding::parameters() {
  if (max_positions_ > 0) return {&weight_, &position_};
  return {&weight_};
}

absl::StatusOr<Tensor> Embedding::Forward(const Tensor& ids, Stash& stash) {
  CONVEYOR_CHECK(ids.rank() == 2, "embedding takes ids [batch, seq]");
  const int64_t batch = ids.dim(0), seq = ids.dim(1);
  if (max_positions_ > 0 && seq > max_positions_) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence of ", seq, " tokens is longer than the ",
                     max_positions_, " learned positions"));
  }
  ASSIGN_OR_RETURN(Tensor y,
                   backend_->Empty({batch, seq, features_}, DType::kF32));
  RETURN_IF_ERROR(backend_->EmbeddingForward(ids, weight_.value, y));
  const DeviceDocuments* documents = CurrentDocuments();
  if (max_positions_ > 0 && documents != nullptr &&
      documents->positions.defined()) {
    // Positions restart at each document: look each token's up.
    RETURN_IF_ERROR(CheckDocumentsFit(*documents, batch, seq, "embedding"));
    ASSIGN_OR_RETURN(Tensor pos,
                     backend_->Empty({batch, seq, features_}, DType::kF32));
    RETURN_IF_ERROR(
        backend_->EmbeddingForward(documents->positions, position_.value, pos));
    backend_->Add(y, pos, y);
    stash.saved = {ids, documents->positions};
    return y;
  }
  if (max_positions_ > 0) {
    // Positions broadcast over the batch: a row bias of length seq*features.
    backend_->AddRowBias(
        y.Reshape({batch, seq * features_}),
        position_.value.Rows(0, seq).Reshape({seq * features_}));
  }
  stash.saved = {ids};
  return y;
}

absl::StatusOr<Tensor> Embedding::BackwardInput(const Tensor& /*dy*/,
                                                Stash& /*stash*/,
                                                bool /*need_dx*/) {
  return Tensor();  // Token ids have no gradient.
}

absl::Status Embedding::BackwardWeight(const Tensor& dy, Stash& stash) {
  const Tensor& ids = stash.saved[0];
  backend_->EmbeddingBackward(ids, dy, weight_.grad);
  if (stash.saved.size() > 1) {
    // Per-token positions (documents): scatter-add as for the tokens.
    backend_->EmbeddingBackward(stash.saved[1], dy, position_.grad);
  } else if (max_positions_ > 0) {
    const int64_t batch = ids.dim(0), seq = ids.dim(1);
    backend_->SumRows(dy.Reshape({batch, seq * features_}), 1.0f,
                      position_.grad.Rows(0, seq).Reshape({seq * features_}));
  }
  return absl::OkStatus();
}

}  // namespace conveyor::engine
