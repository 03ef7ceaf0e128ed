#include "engine/documents.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/host_upload.h"

namespace conveyor::engine {
namespace {

thread_local const DeviceDocuments* current_documents = nullptr;

}  // namespace

absl::Status MicrobatchDocuments::Validate() const {
  const size_t n = static_cast<size_t>(rows * seq_len);
  if (rows < 0 || seq_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("documents: negative layout ", rows, " x ", seq_len));
  }
  if (!positions.empty() && positions.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("documents: ", positions.size(), " positions for ", rows,
                     " rows of ", seq_len, " tokens"));
  }
  if (!segments.empty() && segments.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("documents: ", segments.size(), " segment ids for ", rows,
                     " rows of ", seq_len, " tokens"));
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("documents: position ", positions[i], " at token ", i));
    }
  }
  for (int64_t r = 0; r < rows && !segments.empty(); ++r) {
    const int32_t* s = segments.data() + r * seq_len;
    for (int64_t t = 0; t < seq_len; ++t) {
      const bool ok =
          t == 0 ? s[t] == 0 : s[t] == s[t - 1] || s[t] == s[t - 1] + 1;
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "documents: row ", r, " token ", t, " has segment ", s[t],
            t == 0 ? std::string(" (a row starts at segment 0)")
                   : absl::StrCat(" after ", s[t - 1],
                                  " (documents are contiguous)")));
      }
    }
  }
  return absl::OkStatus();
}

MicrobatchDocuments MicrobatchDocuments::Rows(int64_t begin,
                                              int64_t end) const {
  MicrobatchDocuments out;
  out.rows = end - begin;
  out.seq_len = seq_len;
  if (!positions.empty()) {
    out.positions.assign(positions.begin() + begin * seq_len,
                         positions.begin() + end * seq_len);
  }
  if (!segments.empty()) {
    out.segments.assign(segments.begin() + begin * seq_len,
                        segments.begin() + end * seq_len);
  }
  return out;
}

absl::StatusOr<DeviceDocuments> UploadDocuments(
    Backend* backend, const MicrobatchDocuments& documents) {
  RETURN_IF_ERROR(documents.Validate());
  DeviceDocuments out;
  const int64_t rows = documents.rows, seq = documents.seq_len;
  if (!documents.positions.empty()) {
    ASSIGN_OR_RETURN(out.positions,
                     UploadVector(backend, {rows, seq}, documents.positions));
  }
  if (!documents.segments.empty()) {
    // Segments are contiguous, so a document is one range per row: find
    // each token's [first, end) in one pass each way.
    std::vector<int64_t> spans(static_cast<size_t>(rows * seq * 2));
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t* s = documents.segments.data() + r * seq;
      int64_t* span = spans.data() + r * seq * 2;
      int64_t first = 0;
      for (int64_t t = 0; t < seq; ++t) {
        if (t > 0 && s[t] != s[t - 1]) first = t;
        span[2 * t] = first;
      }
      int64_t end = seq;
      for (int64_t t = seq - 1; t >= 0; --t) {
        if (t < seq - 1 && s[t] != s[t + 1]) end = t + 1;
        span[2 * t + 1] = end;
      }
    }
    ASSIGN_OR_RETURN(out.spans, UploadVector(backend, {rows, seq, 2}, spans));
  }
  return out;
}

const DeviceDocuments* CurrentDocuments() { return current_documents; }

DocumentsScope::DocumentsScope(const DeviceDocuments* documents)
    : previous_(current_documents) {
  current_documents = documents;
}

DocumentsScope::~DocumentsScope() { current_documents = previous_; }

absl::Status CheckDocumentsFit(const DeviceDocuments& documents, int64_t batch,
                               int64_t seq, absl::string_view layer) {
  for (const Tensor* t : {&documents.positions, &documents.spans}) {
    if (t->defined() && (t->dim(0) != batch || t->dim(1) != seq)) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(layer), ": the microbatch's documents are laid out as ",
          t->dim(0), " rows of ", t->dim(1),
          " tokens, but the layer's input is ", batch, " rows of ", seq,
          " tokens (data.documents needs every layer to keep the data's "
          "sequence)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionMask> CurrentAttentionMask(bool causal, int64_t batch,
                                                   int64_t seq,
                                                   absl::string_view layer) {
  AttentionMask mask{.causal = causal};
  const DeviceDocuments* documents = CurrentDocuments();
  if (documents == nullptr || !documents->spans.defined()) return mask;
  RETURN_IF_ERROR(CheckDocumentsFit(*documents, batch, seq, layer));
  mask.spans = documents->spans;
  return mask;
}

}  // namespace conveyor::engine
