// DataSource: the training data of a job, as deterministic batches.
//
// Every sample a step sees is a pure function of (config, step, position in
// the global batch), so the first stage (which reads only inputs) and the last
// stage (which reads only targets) agree on every sample without talking to
// each other, a restarted job sees the same data, and how a batch is cut into
// microbatches never changes which samples it holds:
//
//   step s with global batch B covers positions [s*B, (s+1)*B); microbatch
//   j of M takes the j-th contiguous slice of B/M positions of them.
//
// Position p maps to a sample index of the data set of N samples:
//   - no shuffle: sample p mod N (synthetic data with no num_samples: p);
//   - shuffle: epoch e = p / N, offset r = p mod N, sample perm_e[r], where
//     perm_e is a Fisher-Yates permutation of [0, N) whose swaps are drawn by
//     UniformDraw(seed, "data.shuffle.<e>", k) (engine/init.h). An epoch is
//     thus N consecutive positions, which may start in the middle of a batch.
//
// Kinds:
//   - synthetic-regression (the Alpa tutorial's data): y = x W + b + noise*e,
//     with x and e ~ N(0, 1) per element. W [in, out] ~ N(0, 1/in) (so x W
//     has unit variance at any width; with b, y's variance is about 2) and b
//     [out] ~ N(0, 1) are fixed draws from the seed
//     (SyntheticRegressionParams); x and e of sample i are drawn from the seed
//     at counter i, so a sample does not depend on the batch it falls in.
//     Samples of rank > 1 ([seq, in] -> [seq, out]) map every position through
//     the same W and b.
//   - tensors: a safetensors file with `x` [N, ...input] and `y`
//     [N, ...target]; float dtypes are read as f32 and integer dtypes as i64
//     (integer `x` for token-input models, integer `y` for cross_entropy).
//   - tokens: a file of tokens, each byte one token (vocabulary 256) or, with
//     uint16_tokens, little-endian uint16 tokens (vocabulary 65536), cut into
//     windows of seq_len + 1 tokens for next-token prediction: window w is
//     tokens [w*L, w*L + L + 1) with L = seq_len, so windows overlap by one
//     token and every token after the first is a target exactly once per
//     epoch; N = (T - 1) / L for T tokens (a tail shorter than a window is
//     never used). Inputs are window[:-1], targets window[1:], both i64.
//
// Thread-safety: a DataSource is immutable after Create except for a cache of
// shuffle permutations, which is locked, so Inputs and Targets may be called
// from several threads at once (each thread with a backend it alone drives,
// since backends are thread-compatible).
#ifndef CONVEYOR_ENGINE_DATA_H_
#define CONVEYOR_ENGINE_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/uninitialized_vector.h"
#include "engine/backend.h"
#include "engine/tensor.h"

namespace conveyor::engine {

// The `data:` section of a job. Fields other than kind, seed and shuffle apply
// to one kind only, as marked; Create rejects a non-default value given to a
// kind it does not apply to, since that is most likely a mistake in the job.
struct DataConfig {
  enum class Kind { kSyntheticRegression, kTensors, kTokens };
  Kind kind = Kind::kSyntheticRegression;
  // Seeds the synthetic data and the shuffle permutations.
  uint64_t seed = 0;
  // tensors, tokens: the file to read.
  std::string path = {};
  // Visit the samples of each epoch in a seeded random order (see above).
  bool shuffle = false;
  // tokens: tokens per sample; 0 takes the model's input_shape[0].
  int64_t seq_len = 0;
  // tokens: the file holds little-endian uint16 tokens, not bytes.
  bool uint16_tokens = false;
  // tokens: ids must be < vocab_size; 0 means 256 for bytes, 65536 for
  // uint16 tokens.
  int64_t vocab_size = 0;
  // synthetic-regression: standard deviation of the noise added to y.
  double noise = 0.1;
  // synthetic-regression: the data set size N; 0 means unlimited (every
  // position is a fresh sample, and shuffle is meaningless).
  int64_t num_samples = 0;
};

// "synthetic-regression", "tensors" or "tokens". InvalidArgument lists the
// allowed names.
absl::StatusOr<DataConfig::Kind> ParseDataKind(absl::string_view name);
// Inverse of ParseDataKind.
absl::string_view DataKindName(DataConfig::Kind kind);

// What one sample of the model looks like (no batch dimension); the caller
// fills it from the model spec.
struct SampleShapes {
  std::vector<int64_t> input;
  // Inputs are integer token ids (i64), else f32.
  bool token_input = false;
  std::vector<int64_t> target;
  // Targets are integer class ids (i64, cross_entropy), else f32 (mse).
  bool integer_targets = false;
  // Token models: every id must be below this to reach the embedding and
  // the loss (the smaller of the embedding's vocab_size and the output's
  // classes); 0 when the model does not say.
  int64_t vocab = 0;
};

// The fixed truth behind synthetic-regression data: W row-major [in, out]
// (note: the transpose of torch.nn.Linear's weight) and b [out]. Exposed so
// that tests can check what a model learned.
struct SyntheticRegressionParams {
  // Not zeroed first: a cancelled draw stops at once, leaving the rest
  // unwritten (and, for a large W, not even resident).
  UninitializedVector<float> weight;
  std::vector<float> bias;
};
SyntheticRegressionParams MakeSyntheticRegressionParams(uint64_t seed,
                                                        int64_t in_features,
                                                        int64_t out_features);

// The checks of `config` against the model's `shapes` that need no file:
// synthetic-regression's float [..., in] -> [..., out] shapes, tokens' token
// input [seq_len] and integer targets. The job parser runs them to report a
// mismatch at the YAML's position; Create runs them too. InvalidArgument
// naming the field (as written in the YAML) and both values.
absl::Status CheckDataShapes(const DataConfig& config,
                             const SampleShapes& shapes);

class DataSource {
 public:
  virtual ~DataSource() = default;

  // Validates `config` against the model's `shapes` and loads any file.
  // Returns InvalidArgument naming the field and both values when they
  // disagree (synthetic-regression needs f32 inputs [..., in] and targets [...,
  // out] with the same leading dimensions; tensors needs x and y to match the
  // input and target shapes and types; tokens needs [seq_len] token inputs and
  // [seq_len] integer targets), when the file is malformed, too short for one
  // window or holds a token id >= vocab_size; the errno-derived code (NotFound,
  // ...) when a file cannot be read.
  static absl::StatusOr<std::unique_ptr<DataSource>> Create(
      const DataConfig& config, const SampleShapes& shapes);

  // What Create would refuse, without making what only has to be sized:
  // synthetic-regression's W (gigabytes for a wide model) is checked
  // against the host's memory, not drawn. File sources are read and
  // checked as Create does.
  static absl::Status Check(const DataConfig& config,
                            const SampleShapes& shapes);

  // The inputs of microbatch `microbatch` of `num_microbatches` of step
  // `step` with global batch `batch_size`, on `backend`: shape
  // [batch_size / num_microbatches, ...input], i64 for token inputs, else
  // f32. InvalidArgument if a size is not positive, batch_size is not a
  // multiple of num_microbatches, microbatch is outside [0,
  // num_microbatches), step is negative or the positions overflow int64;
  // the backend's error (ResourceExhausted, ...) if it cannot hold the
  // result.
  virtual absl::StatusOr<Tensor> Inputs(Backend* backend, int64_t step,
                                        int microbatch, int num_microbatches,
                                        int64_t batch_size) = 0;
  // The matching targets: [batch_size / num_microbatches, ...target], i64
  // for integer targets, else f32. Errors as for Inputs.
  virtual absl::StatusOr<Tensor> Targets(Backend* backend, int64_t step,
                                         int microbatch, int num_microbatches,
                                         int64_t batch_size) = 0;

  // The data set size N (samples per epoch); 0 for unlimited.
  virtual int64_t num_samples() const = 0;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_DATA_H_
