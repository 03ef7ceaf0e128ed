// A pre-tokenizer pattern: a regular expression compiled with PCRE2 in UTF
// mode with Unicode properties (\p{L}, \p{N}), as HF's tokenizers compile
// theirs with Oniguruma. Patterns are written for Oniguruma, so the few
// escapes that mean something else in PCRE2 are rewritten first
// (FromOniguruma). Subjects may hold invalid UTF-8: such bytes never match
// anything (PCRE2_MATCH_INVALID_UTF), so a byte-level tokenizer sees them
// as the text between matches.
//
// Every search is bounded (PCRE2's match limit): a pathological pattern,
// such as nested quantifiers on a text that almost matches, fails with an
// error instead of running for hours.
//
// Thread-safety: immutable once compiled; ForEachMatch may run on many
// threads at once (each call has its own match data).
#ifndef CONVEYOR_TOKENIZER_INTERNAL_REGEX_H_
#define CONVEYOR_TOKENIZER_INTERNAL_REGEX_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::tokenizer::tokenizer_internal {

class Regex {
 public:
  // PCRE2's own default: far above what the patterns of real tokenizers use
  // on any text (a few steps a character), and reached in well under a
  // second by one that backtracks exponentially.
  static constexpr uint32_t kDefaultMatchLimit = 10'000'000;

  // InvalidArgument "pattern <p>: <PCRE2's message> at offset N" when the
  // pattern does not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(
      absl::string_view pattern, uint32_t match_limit = kDefaultMatchLimit);

  // A pattern that matches `literal` exactly (HF's Split with a String).
  static std::string Escape(absl::string_view literal);

  // `pattern` with Oniguruma's meaning in PCRE2's syntax: \s and \S take in
  // U+0085 (NEL), which Oniguruma counts as white space and PCRE2 does not;
  // \w and \W are letters, marks, numbers and connector punctuation, as in
  // Oniguruma; \h and \H are hexadecimal digits (in PCRE2 they would be
  // horizontal white space). Everything else is passed through.
  static std::string FromOniguruma(absl::string_view pattern);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(start, end) for each non-empty match in `subject`, left
  // to right, each search starting where the previous match ended (one
  // character on after an empty match, which is not reported): Oniguruma's
  // find_iter, as HF's Split uses it. Stops at the first error on_match
  // returns, and returns it. InvalidArgument when a search exceeds the
  // match limit ("... gave up after N steps at byte B ...").
  absl::Status ForEachMatch(
      absl::string_view subject,
      absl::FunctionRef<absl::Status(size_t start, size_t end)> on_match) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Pcre2;
  Regex(std::string pattern, std::unique_ptr<Pcre2> pcre2,
        uint32_t match_limit);

  std::string pattern_;
  std::unique_ptr<Pcre2> pcre2_;
  uint32_t match_limit_;
};

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_REGEX_H_
