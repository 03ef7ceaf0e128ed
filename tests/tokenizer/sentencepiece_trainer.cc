// No abseil header may be included here (see the header).
#include "tests/tokenizer/sentencepiece_trainer.h"

#include <sentencepiece_trainer.h>

namespace conveyor::tokenizer::testing {

std::string TrainSentencePiece(const std::string& input_file,
                               const std::string& model_prefix,
                               const std::string& options) {
  const sentencepiece::util::Status status =
      sentencepiece::SentencePieceTrainer::Train(
          "--input=" + input_file + " --model_prefix=" + model_prefix + " " +
          options);
  return status.ok() ? "" : status.ToString();
}

}  // namespace conveyor::tokenizer::testing
