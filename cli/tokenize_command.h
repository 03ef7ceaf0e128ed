// `conveyorctl tokenize --tokenizer FILE INPUT... -o PREFIX
//      [--format auto|text|jsonl] [--field text] [--threads N] [--overwrite]`:
// tokenizes documents into a Megatron indexed dataset, PREFIX.bin and
// PREFIX.idx: one sequence (and one document) per input document, each
// ended by the tokenizer's EOD (its EOS token), in input order. The ids are
// uint16 when the vocabulary has at most 65536 of them, else int32.
//
// Documents: a text file is one document; a JSON-lines file (--format
// jsonl, or auto for names ending .jsonl or .json) has one per line, the
// string in --field; blank lines are skipped, and empty documents left out.
// The tokenizer is anything tokenizer::Tokenizer::Load takes (a
// tokenizer.json, a tokenizer.model, or an HF directory holding one);
// special tokens written in the text are encoded as such.
//
// Documents are tokenized on --threads threads (0: every core) and written
// in order, so the output does not depend on the thread count. A progress
// bar goes to the error stream when it is a terminal; a summary line to the
// output stream always. The files appear whole or not at all: they are
// written under temporary names and renamed when complete.
//
// Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_TOKENIZE_COMMAND_H_
#define CONVEYOR_CLI_TOKENIZE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace conveyor::cli {

struct TokenizeCommandOptions {
  std::string tokenizer = {};
  std::vector<std::string> inputs = {};
  std::string output = {};  // PREFIX.
  std::string format = "auto";
  std::string field = "text";
  int threads = 0;  // 0: every core.
  bool overwrite = false;
};

CLI::App* AddTokenizeCommand(CLI::App& app, TokenizeCommandOptions& options);

// Runs the command; `progress`: draw the progress bar on `err`.
// Errors, before anything is written:
//   InvalidArgument     bad flags (no inputs, no -o, an unknown --format,
//                       --threads < 0, an empty --field), an input that is
//                       not a regular file, a bad tokenizer file;
//   NotFound, PermissionDenied (errno)  an input or the tokenizer missing
//                       or unreadable, the output directory missing or not
//                       writable;
//   AlreadyExists       PREFIX.bin or PREFIX.idx exists, without
//                       --overwrite;
//   FailedPrecondition  the tokenizer has no EOS token;
// and while running: InvalidArgument "<file>:<line>: ..." for a JSON line
// that is not an object with a string --field, the read and write errors
// naming their file.
absl::Status RunTokenizeCommand(const TokenizeCommandOptions& options,
                                bool progress, std::ostream& out,
                                std::ostream& err);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_TOKENIZE_COMMAND_H_
