#include "tokenizer/internal/pre_tokenizer.h"

#include <string>
#include <utility>

#include "common/status_macros.h"

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

// Turns the stretches of a piece (the matches and the text between them,
// in order) into the pieces a SplitBehavior makes, without holding more
// than one pending piece: a text of any length splits in constant memory.
class SplitAssembler {
 public:
  SplitAssembler(SplitBehavior behavior,
                 absl::FunctionRef<absl::Status(size_t, size_t)> emit)
      : behavior_(behavior), emit_(emit) {}

  absl::Status Add(size_t start, size_t end, bool is_match) {
    switch (behavior_) {
      case SplitBehavior::kRemoved:
        return is_match ? absl::OkStatus() : emit_(start, end);
      case SplitBehavior::kIsolated:
        return emit_(start, end);
      case SplitBehavior::kMergedWithPrevious:
        // A match joins the stretch before it, unless that is a match too.
        if (is_match && has_pending_ && !pending_is_match_) {
          pending_end_ = end;
          pending_is_match_ = true;
          return absl::OkStatus();
        }
        return Replace(start, end, is_match);
      case SplitBehavior::kMergedWithNext:
        // A match joins the stretch after it, unless that is a match too.
        if (!is_match && has_pending_ && pending_is_match_) {
          pending_end_ = end;
          pending_is_match_ = false;
          RETURN_IF_ERROR(emit_(pending_start_, pending_end_));
          has_pending_ = false;
          return absl::OkStatus();
        }
        return Replace(start, end, is_match);
      case SplitBehavior::kContiguous:
        // Neighbours of one kind become one piece.
        if (has_pending_ && pending_is_match_ == is_match) {
          pending_end_ = end;
          return absl::OkStatus();
        }
        return Replace(start, end, is_match);
    }
    return absl::OkStatus();
  }

  absl::Status Finish() {
    if (!has_pending_) return absl::OkStatus();
    has_pending_ = false;
    return emit_(pending_start_, pending_end_);
  }

 private:
  // Emits the pending piece, if any, and holds this stretch instead.
  absl::Status Replace(size_t start, size_t end, bool is_match) {
    RETURN_IF_ERROR(Finish());
    has_pending_ = true;
    pending_start_ = start;
    pending_end_ = end;
    pending_is_match_ = is_match;
    return absl::OkStatus();
  }

  SplitBehavior behavior_;
  absl::FunctionRef<absl::Status(size_t, size_t)> emit_;
  bool has_pending_ = false;
  size_t pending_start_ = 0;
  size_t pending_end_ = 0;
  bool pending_is_match_ = false;
};

}  // namespace

PreTokenizer::PreTokenizer(std::vector<PreTokenizerStep> steps)
    : steps_(std::move(steps)) {}

absl::Status PreTokenizer::Run(
    absl::string_view text,
    absl::FunctionRef<void(absl::string_view)> on_word) const {
  return RunFrom(0, text, on_word);
}

absl::Status PreTokenizer::RunFrom(
    size_t step, absl::string_view piece,
    absl::FunctionRef<void(absl::string_view)> on_word) const {
  if (piece.empty()) return absl::OkStatus();
  if (step == steps_.size()) {
    on_word(piece);
    return absl::OkStatus();
  }
  const PreTokenizerStep& current = steps_[step];
  if (current.kind == PreTokenizerStep::Kind::kByteLevel &&
      current.add_prefix_space && piece[0] != ' ') {
    std::string prefixed;
    prefixed.reserve(piece.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(piece.data(), piece.size());
    return Split(step, prefixed, on_word);
  }
  return Split(step, piece, on_word);
}

absl::Status PreTokenizer::Split(
    size_t step, absl::string_view piece,
    absl::FunctionRef<void(absl::string_view)> on_word) const {
  const PreTokenizerStep& current = steps_[step];
  if (current.regex == nullptr) return RunFrom(step + 1, piece, on_word);
  const auto emit = [&](size_t start, size_t end) {
    return RunFrom(step + 1, piece.substr(start, end - start), on_word);
  };
  SplitAssembler assembler(current.behavior, emit);
  size_t previous_end = 0;
  RETURN_IF_ERROR(current.regex->ForEachMatch(
      piece, [&](size_t start, size_t end) -> absl::Status {
        if (previous_end < start) {
          RETURN_IF_ERROR(assembler.Add(previous_end, start, current.invert));
        }
        previous_end = end;
        return assembler.Add(start, end, !current.invert);
      }));
  if (previous_end < piece.size()) {
    RETURN_IF_ERROR(assembler.Add(previous_end, piece.size(), current.invert));
  }
  return assembler.Finish();
}

}  // namespace conveyor::tokenizer::tokenizer_internal
