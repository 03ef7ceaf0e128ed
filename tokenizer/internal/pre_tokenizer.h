// The pre-tokenizer of a byte-level tokenizer.json: a text to the pieces
// ("pre-tokens", roughly words) the BPE model encodes one by one. The steps
// HF's Sequence runs in order, each on every piece the step before made:
// Split (a pattern, with what becomes of the matches: HF's
// SplitDelimiterBehavior) and, last, ByteLevel (an optional leading space,
// and GPT-2's pattern when use_regex). A ByteLevel step maps the bytes to
// its alphabet too, but this tokenizer works on bytes throughout, so there
// is nothing to map.
//
// Thread-safety: immutable after construction; Run may run on many threads.
#ifndef CONVEYOR_TOKENIZER_INTERNAL_PRE_TOKENIZER_H_
#define CONVEYOR_TOKENIZER_INTERNAL_PRE_TOKENIZER_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tokenizer/internal/regex.h"

namespace conveyor::tokenizer::tokenizer_internal {

// GPT-2's pattern, which ByteLevel splits with when use_regex is set.
inline constexpr absl::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

// On "the-final--countdown" split on '-': kRemoved gives the, final,
// countdown; kIsolated the, -, final, -, -, countdown; kMergedWithPrevious
// the-, final-, -, countdown; kMergedWithNext the, -final, -, -countdown;
// kContiguous the, -, final, --, countdown.
enum class SplitBehavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous,
};

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  // Split: its pattern. ByteLevel: GPT-2's pattern when use_regex, else
  // null.
  std::unique_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;  // Split: the matches are the pieces' content.
  // ByteLevel: a piece that does not start with a space gets one.
  bool add_prefix_space = false;
};

class PreTokenizer {
 public:
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps);

  // Calls on_word for each non-empty pre-token of `text`, in order; the
  // view may point into `text` or into a temporary. The errors of the
  // patterns (Regex::ForEachMatch).
  absl::Status Run(absl::string_view text,
                   absl::FunctionRef<void(absl::string_view)> on_word) const;

 private:
  absl::Status RunFrom(
      size_t step, absl::string_view piece,
      absl::FunctionRef<void(absl::string_view)> on_word) const;
  absl::Status Split(size_t step, absl::string_view piece,
                     absl::FunctionRef<void(absl::string_view)> on_word) const;

  std::vector<PreTokenizerStep> steps_;
};

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_PRE_TOKENIZER_H_
