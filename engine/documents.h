// Documents packed into a microbatch: where each token's document begins and
// ends within its row, and its position in that document, so that attention
// stays inside a document (`document_mask`) and positions restart at each
// one (`reset_position_ids`), as Megatron's --reset-attention-mask and
// --reset-position-ids and TorchTitan's document masks do.
//
// The data source says where documents fall (engine/data.h, Documents); the
// executor hands each stage the layout of every microbatch before its forward
// (PipelineStage::SetDocuments), and the stage uploads it and makes it the
// current thread's while it runs that microbatch's actions
// (DocumentsScope). Layers that care (embedding positions, attention, RoPE)
// read CurrentDocuments() in Forward and save in their stash what their
// backward needs. It travels with the thread, not as an argument, for the
// reason the cancellation does (common/cancellation.h): the layers sit under
// an interface (Layer::Forward) with no reason to know about documents, and
// composites would otherwise have to relay it to every child.
//
// Every stage computes the layout from the data source itself instead of
// receiving it from the previous stage: the layout is a pure function of
// (data config, step, microbatch), exactly like the targets the last stage
// reads, so nothing about it crosses the network and stages cannot disagree.
#ifndef CONVEYOR_ENGINE_DOCUMENTS_H_
#define CONVEYOR_ENGINE_DOCUMENTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/tensor.h"

namespace conveyor::engine {

// One microbatch's documents, host side, row-major [rows, seq].
struct MicrobatchDocuments {
  int64_t rows = 0, seq_len = 0;
  // The token's position within its document; empty: 0..seq_len-1 in every row
  // (positions are not reset).
  std::vector<int64_t> positions;
  // The token's document within its row: 0 at t = 0, non-decreasing, at most
  // +1 per token (documents are contiguous); empty: no document mask.
  std::vector<int32_t> segments;

  bool empty() const { return positions.empty() && segments.empty(); }
  // InvalidArgument when a vector's size is not rows * seq, a position is
  // negative, or segments are not contiguous as above.
  absl::Status Validate() const;
  // Rows [begin, end): a data-parallel replica's share.
  MicrobatchDocuments Rows(int64_t begin, int64_t end) const;
};

// The same on a backend, in the form the kernels take.
struct DeviceDocuments {
  // I64 [rows, seq]: positions; undefined when not reset.
  Tensor positions;
  // I64 [rows, seq, 2]: the [first, end) token range of the token's document
  // in its row, so a query attends to keys in that range only (and, causal,
  // to none after itself); undefined without a document mask.
  Tensor spans;
};

// Validates `documents` and uploads it to `backend`.
absl::StatusOr<DeviceDocuments> UploadDocuments(
    Backend* backend, const MicrobatchDocuments& documents);

// The documents of the microbatch the calling thread's stage runs now;
// nullptr outside a DocumentsScope or when the microbatch has none.
const DeviceDocuments* CurrentDocuments();

// Makes `documents` (not owned; may be null) the calling thread's for the
// scope's life, restoring the previous one after.
class DocumentsScope {
 public:
  explicit DocumentsScope(const DeviceDocuments* documents);
  ~DocumentsScope();
  DocumentsScope(const DocumentsScope&) = delete;
  DocumentsScope& operator=(const DocumentsScope&) = delete;

 private:
  const DeviceDocuments* previous_;
};

// Checks that `documents`' tensors fit a layer input of `batch` rows of `seq`
// tokens: InvalidArgument naming `layer` otherwise (a model whose layers
// change the sequence length cannot take documents).
absl::Status CheckDocumentsFit(const DeviceDocuments& documents, int64_t batch,
                               int64_t seq, absl::string_view layer);

// The mask of attention over [batch, seq] rows of the current microbatch:
// `causal`, and its document spans when it has a document mask.
// CheckDocumentsFit's error when the documents do not fit.
absl::StatusOr<AttentionMask> CurrentAttentionMask(bool causal, int64_t batch,
                                                   int64_t seq,
                                                   absl::string_view layer);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_DOCUMENTS_H_
