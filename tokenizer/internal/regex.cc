#include "tokenizer/internal/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tokenizer/internal/utf8.h"

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", code);
  }
  return reinterpret_cast<const char*>(buffer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

// Oniguruma's classes, spelled for PCRE2 in and out of a [...] class.
constexpr absl::string_view kSpaceInClass = "\\s\\x{85}";
constexpr absl::string_view kWordInClass = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr absl::string_view kHexInClass = "0-9A-Fa-f";

}  // namespace

struct Regex::Pcre2 {
  pcre2_code* code = nullptr;
  pcre2_match_context* context = nullptr;
  ~Pcre2() {
    pcre2_match_context_free(context);
    pcre2_code_free(code);
  }
};

Regex::Regex(std::string pattern, std::unique_ptr<Pcre2> pcre2,
             uint32_t match_limit)
    : pattern_(std::move(pattern)),
      pcre2_(std::move(pcre2)),
      match_limit_(match_limit) {}

Regex::~Regex() = default;

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(absl::string_view pattern,
                                                      uint32_t match_limit) {
  auto pcre2 = std::make_unique<Pcre2>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                              pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                              &error, &offset, nullptr);
  if (pcre2->code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pattern \"", absl::CEscape(pattern),
                     "\": ", Pcre2Message(error), " at offset ", offset));
  }
  // JIT matching is several times faster; where it is not available
  // (another architecture, or a kernel that forbids executable memory) the
  // interpreter gives the same matches.
  (void)pcre2_jit_compile(pcre2->code, PCRE2_JIT_COMPLETE);
  pcre2->context = pcre2_match_context_create(nullptr);
  if (pcre2->context == nullptr) {
    return absl::ResourceExhaustedError("out of memory for a PCRE2 context");
  }
  pcre2_set_match_limit(pcre2->context, match_limit);
  return std::unique_ptr<Regex>(
      new Regex(std::string(pattern), std::move(pcre2), match_limit));
}

std::string Regex::Escape(absl::string_view literal) {
  std::string out;
  out.reserve(literal.size() * 2);
  for (char c : literal) {
    const auto byte = static_cast<unsigned char>(c);
    // Every ASCII punctuation character is safe to escape in PCRE2, and
    // escaping all of them spares a list of which ones are special.
    if (byte < 0x80 && !(std::isalnum(byte) || c == ' ')) {
      if (byte < 0x20 || byte == 0x7F) {
        absl::StrAppend(&out, "\\x{", absl::Hex(byte), "}");
        continue;
      }
      out.push_back('\\');
    }
    out.push_back(c);
  }
  return out;
}

std::string Regex::FromOniguruma(absl::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char escaped = pattern[i + 1];
      if (escaped == 'Q') {  // Quoted text up to \E: copied as it is.
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop =
            end == absl::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.data() + i, stop - i);
        i = stop;
        continue;
      }
      absl::string_view inner;
      bool negated = false;
      switch (escaped) {
        case 's':
          inner = kSpaceInClass;
          break;
        case 'S':
          inner = kSpaceInClass;
          negated = true;
          break;
        case 'w':
          inner = kWordInClass;
          break;
        case 'W':
          inner = kWordInClass;
          negated = true;
          break;
        case 'h':
          inner = kHexInClass;
          break;
        case 'H':
          inner = kHexInClass;
          negated = true;
          break;
        default:
          break;
      }
      if (inner.empty() || (negated && in_class)) {
        // Not one of ours, or a negated class inside a class, which has no
        // spelling as a union: kept (it differs from Oniguruma only for
        // the characters above).
        out.append(pattern.data() + i, 2);
      } else if (in_class) {
        out.append(inner.data(), inner.size());
      } else {
        absl::StrAppend(&out, negated ? "[^" : "[", inner, "]");
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      // "[^]...]" and "[]...]": a ']' first in a class is a literal.
      if (i < pattern.size() && pattern[i] == '^') out.push_back(pattern[i++]);
      if (i < pattern.size() && pattern[i] == ']') out.push_back(pattern[i++]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() &&
        pattern[i + 1] == ':') {  // A POSIX class such as [:alpha:].
      const size_t end = pattern.find(":]", i + 2);
      if (end != absl::string_view::npos) {
        out.append(pattern.data() + i, end + 2 - i);
        i = end + 2;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

absl::Status Regex::ForEachMatch(
    absl::string_view subject,
    absl::FunctionRef<absl::Status(size_t start, size_t end)> on_match) const {
  if (subject.empty()) return absl::OkStatus();
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(pcre2_->code, nullptr));
  if (data == nullptr) {
    return absl::ResourceExhaustedError("out of memory for PCRE2 match data");
  }
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  while (pos < subject.size()) {
    int rc = pcre2_match(pcre2_->code, text, subject.size(), pos, 0, data.get(),
                         pcre2_->context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The JIT's fixed stack is small; the interpreter keeps its
      // backtracking on the heap (within PCRE2's heap limit).
      rc = pcre2_match(pcre2_->code, text, subject.size(), pos, PCRE2_NO_JIT,
                       data.get(), pcre2_->context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      const bool limit = rc == PCRE2_ERROR_MATCHLIMIT ||
                         rc == PCRE2_ERROR_DEPTHLIMIT ||
                         rc == PCRE2_ERROR_HEAPLIMIT;
      return absl::InvalidArgumentError(absl::StrCat(
          "pattern \"", absl::CEscape(pattern_), "\" ",
          limit ? absl::StrCat("gave up after ", match_limit_,
                               " backtracking steps")
                : std::string("failed"),
          " at byte ", pos, " of a text of ", subject.size(), " bytes (",
          Pcre2Message(rc), ")",
          limit ? ": the pattern backtracks without bound on this text "
                  "(nested quantifiers?)"
                : ""));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (end > start) {
      RETURN_IF_ERROR(on_match(start, end));
      pos = end;
    } else if (start >= subject.size()) {
      break;
    } else {
      // An empty match reports nothing; the search goes on a character
      // (or, at an invalid byte, a byte) further on.
      char32_t code_point;
      const size_t length = DecodeUtf8(subject, start, &code_point);
      pos = start + (length == 0 ? 1 : length);
    }
  }
  return absl::OkStatus();
}

}  // namespace conveyor::tokenizer::tokenizer_internal
