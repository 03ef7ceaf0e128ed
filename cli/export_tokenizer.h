// The files that travel with an HF checkpoint's weights so that it can be
// run: its tokenizer (tokenizer.json, SentencePiece's tokenizer.model,
// tokenizer_config.json, special_tokens_map.json) and generation_config.json.
// `conveyorctl export --format hf` copies them into the export, from the
// directory the model was imported from (model.from_hf) or from the paths
// given with --tokenizer.
//
// The import's files are a convenience: what cannot be copied becomes a
// warning, and the export still succeeds. Paths given with --tokenizer are
// the user's explicit request: they are checked before anything is written,
// and any problem is an error.
// Thread-compatible.
#ifndef CONVEYOR_CLI_EXPORT_TOKENIZER_H_
#define CONVEYOR_CLI_EXPORT_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor::cli {

// Whichever of these a directory holds are copied.
inline constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
    "special_tokens_map.json", "generation_config.json"};
// Real tokenizer files are a few MB (Llama-3's tokenizer.json: 9 MB).
inline constexpr uint64_t kMaxTokenizerFileBytes = uint64_t{256} << 20;

struct CopiedFiles {
  std::vector<std::string> names;     // Written into the output, in order.
  std::vector<std::string> warnings;  // "warning: ..." lines.
};

// Copies whichever of kTokenizerFiles `source_dir` (the model's import)
// holds into `out_dir`, leaving alone names `out_dir` already has (the
// checkpoint writer's own). Never fails: a directory that is gone, holds
// no tokenizer (neither tokenizer.json nor tokenizer.model), or a file that
// cannot be copied (unreadable, not a regular file, over
// kMaxTokenizerFileBytes) is a warning naming it.
CopiedFiles CopyImportedTokenizerFiles(const std::string& source_dir,
                                       const std::string& out_dir);

// `--tokenizer PATH`s: each a directory (whichever of kTokenizerFiles it
// holds; it must hold tokenizer.json or tokenizer.model) or a file, copied
// under its own name. InvalidArgument for a directory without a tokenizer,
// a file named as the checkpoint's own files (config.json,
// model.safetensors, model.safetensors.index.json), two paths giving the
// same name, or something neither a directory nor a regular file; NotFound
// for a missing path.
absl::Status CheckTokenizerPaths(const std::vector<std::string>& paths);

// Copies what CheckTokenizerPaths accepted into `out_dir`; the names
// written. A file named by a path replaces one the checkpoint writer wrote
// (generation_config.json); a directory's files do not. Errors: ReadFile's
// and WriteFileAtomically's (common/file.h).
absl::StatusOr<std::vector<std::string>> CopyTokenizerPaths(
    const std::vector<std::string>& paths, const std::string& out_dir);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_EXPORT_TOKENIZER_H_
