// The tokens data source (engine/data.h): a file of byte or uint16 tokens
// cut into overlapping windows for next-token prediction.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "engine/data.h"
#include "engine/internal/data_sources.h"

namespace conveyor::engine::data_internal {
namespace {

class TokensSource final : public IndexedDataSource {
 public:
  TokensSource(const DataConfig& config, int64_t seq_len,
               std::vector<uint16_t> tokens)
      : IndexedDataSource((static_cast<int64_t>(tokens.size()) - 1) / seq_len,
                          config.shuffle, config.seed),
        seq_len_(seq_len),
        tokens_(std::move(tokens)) {}

 protected:
  absl::StatusOr<Tensor> GatherInputs(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    return Windows(backend, samples, 0);
  }
  absl::StatusOr<Tensor> GatherTargets(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    return Windows(backend, samples, 1);
  }

 private:
  // Tokens [w * seq_len + shift, w * seq_len + shift + seq_len) of window w.
  absl::StatusOr<Tensor> Windows(Backend* backend,
                                 const std::vector<int64_t>& samples,
                                 int64_t shift) const {
    std::vector<int64_t> out(samples.size() * seq_len_);
    for (size_t r = 0; r < samples.size(); ++r) {
      const int64_t begin = samples[r] * seq_len_ + shift;
      for (int64_t t = 0; t < seq_len_; ++t) {
        out[r * seq_len_ + t] = tokens_[begin + t];
      }
    }
    return Upload(backend, {static_cast<int64_t>(samples.size()), seq_len_},
                  out);
  }

  const int64_t seq_len_;
  const std::vector<uint16_t> tokens_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DataSource>> CreateTokens(
    const DataConfig& config, const SampleShapes& shapes) {
  if (config.path.empty()) {
    return absl::InvalidArgumentError(
        "data.path is required for data.source tokens");
  }
  const int64_t seq_len =
      config.seq_len == 0 ? shapes.input[0] : config.seq_len;
  const int64_t max_vocab = config.uint16_tokens ? 65536 : 256;
  if (config.vocab_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.vocab_size must be positive (or 0 for ", max_vocab,
                     "), got ", config.vocab_size));
  }
  // Without data.vocab_size, ids are bounded by what the model takes.
  const bool from_model =
      config.vocab_size == 0 && shapes.vocab > 0 && shapes.vocab < max_vocab;
  const int64_t vocab_size = config.vocab_size != 0 ? config.vocab_size
                             : from_model           ? shapes.vocab
                                                    : max_vocab;

  ASSIGN_OR_RETURN(std::string bytes, ReadFile(config.path));
  if (config.uint16_tokens && bytes.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.path, ": ", bytes.size(),
                     " bytes is an odd size for a file of uint16 tokens"));
  }
  std::vector<uint16_t> tokens(config.uint16_tokens ? bytes.size() / 2
                                                    : bytes.size());
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < tokens.size(); ++i) {
    // Little-endian whatever the host, so files move between machines.
    tokens[i] =
        config.uint16_tokens
            ? static_cast<uint16_t>(data[2 * i] | (data[2 * i + 1] << 8))
            : data[i];
    if (tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(config.path, ": token ", i, " is ", tokens[i],
                       from_model ? ", not below the model's vocabulary "
                                  : ", not below data.vocab_size ",
                       vocab_size));
    }
  }
  bytes = std::string();  // Free the copy before the source keeps tokens.
  const int64_t num_tokens = static_cast<int64_t>(tokens.size());
  if (num_tokens < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.path, ": ", num_tokens, " tokens are too few for one window of ",
        "seq_len + 1 = ", seq_len + 1, " tokens"));
  }
  return std::make_unique<TokensSource>(config, seq_len, std::move(tokens));
}

}  // namespace conveyor::engine::data_internal
