// Trains a small SentencePiece model for tests with Debian's
// libsentencepiece_train. Declared with standard types only: the library's
// headers clash with Debian's abseil (tokenizer/internal/
// sentencepiece_backend.h), so they stay in the .cc.
#ifndef CONVEYOR_TESTS_TOKENIZER_SENTENCEPIECE_TRAINER_H_
#define CONVEYOR_TESTS_TOKENIZER_SENTENCEPIECE_TRAINER_H_

#include <string>

namespace conveyor::tokenizer::testing {

// Trains on the lines of `input_file` and writes <model_prefix>.model.
// `options` are more trainer flags ("--vocab_size=300 ..."). Returns "" on
// success, else the trainer's message.
std::string TrainSentencePiece(const std::string& input_file,
                               const std::string& model_prefix,
                               const std::string& options);

}  // namespace conveyor::tokenizer::testing

#endif  // CONVEYOR_TESTS_TOKENIZER_SENTENCEPIECE_TRAINER_H_
