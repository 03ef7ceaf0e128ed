// Which tokens are BOS and EOS, as Tokenizer::Load finds them: what
// tokenizer_config.json says ("bos_token", "eos_token": a string, an
// {"content": ...} object, or null for none), else what
// special_tokens_map.json says, in the directory of the tokenizer file;
// else the model's own (a SentencePiece model records its ids); else the
// first of the known names the vocabulary has (BOS: <|begin_of_text|>,
// <s>; EOS: <|end_of_text|>, <|endoftext|>, </s>).
//
// Thread-safety: stateless functions.
#ifndef CONVEYOR_TOKENIZER_INTERNAL_SPECIAL_TOKENS_H_
#define CONVEYOR_TOKENIZER_INTERNAL_SPECIAL_TOKENS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::tokenizer::tokenizer_internal {

// What the configuration files say about one token.
struct NamedToken {
  bool given = false;               // Some file has the key.
  std::optional<std::string> name;  // Its token; nullopt: "none" (null).
  std::string source;               // The file that said it.
};

struct SpecialTokenNames {
  NamedToken bos;
  NamedToken eos;
};

// Reads the two files in `directory` where they exist. Errors name the file:
// the errno-derived code when one exists but cannot be read,
// InvalidArgument when one is not JSON or a key holds something that names
// no token (a number, an object without "content").
absl::StatusOr<SpecialTokenNames> ReadSpecialTokenNames(
    const std::string& directory);

struct SpecialTokenIds {
  std::optional<int64_t> bos;
  std::optional<int64_t> eos;
};

// The ids, from the names (looked up with `find`), the model's own ids and
// the known names, in that order. InvalidArgument naming the file when it
// names a token `find` does not know ("... is not in the vocabulary of
// <tokenizer_file>").
absl::StatusOr<SpecialTokenIds> ResolveSpecialTokens(
    const SpecialTokenNames& names, absl::string_view tokenizer_file,
    absl::FunctionRef<std::optional<int64_t>(absl::string_view)> find,
    std::optional<int64_t> model_bos, std::optional<int64_t> model_eos);

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_SPECIAL_TOKENS_H_
