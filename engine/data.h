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
//   - tokens: a headerless file of little-endian token ids (dtype uint8, the
//     default, one byte per token; uint16; uint32; int32).
//   - llmc: an llm.c token shard: a header of 256 little-endian int32
//     (header[0] the magic, 20240520 for uint16 tokens or 20240801 for
//     uint32 tokens; header[1] the version, 1; header[2] the token count,
//     which must match the file's size), then the tokens.
//   - megatron: a Megatron indexed data set PREFIX.bin + PREFIX.idx
//     (engine/megatron_format.h, checked by engine/megatron_index.h); the
//     token stream is its sequences in index order. With `blend`, several
//     such data sets mixed by weight (below).
//   The three token kinds cut their stream of T tokens into windows of
//   seq_len + 1 tokens for next-token prediction: window w is tokens [w*L,
//   w*L + L + 1) with L = seq_len, so windows overlap by one token and every
//   token after the first is a target exactly once per epoch; N = (T - 1) /
//   L (a tail shorter than a window is never used). Inputs are window[:-1],
//   targets window[1:], both i64. Files are memory-mapped (common/
//   mapped_file.h): a data set larger than RAM costs page cache, not process
//   memory (after every 64 MiB read from a file, its pages are unmapped from
//   the process again, so even the mapped pages it counts stay bounded). Every
//   id is checked against the vocabulary (the smallest of data.vocab_size, the
//   model's vocabulary and what the dtype can hold) when a window is gathered,
//   and the whole file at Create when it is at most kFullCheckBytes; a bad id
//   fails Inputs/Targets with InvalidArgument naming the file and the id's byte
//   offset, before it reaches an embedding.
//
// Blends (megatron with `blend`): data set k of K has weight w_k > 0. The
// weights are made exact integers a_k (decimals scaled by the smallest power
// of ten, at most 10^6, that makes every weight whole with a sum of at most
// R = min(2^20, 2^28 / K); otherwise rounded to parts of R, each at least
// 1), divided by their gcd, with period P = sum a_k. Sample i
// of the blend goes to the data set with the largest a_k * (r + 1) - P *
// c_k, ties to the lowest k, where r = i mod P and c_k counts the earlier
// samples of the period that went to k: Megatron's greedy rule (weights
// times samples so far minus samples taken), which over each period gives
// data set k exactly a_k samples. The n-th sample drawn from data set k is
// its window n mod N_k, or with shuffle perm_{k,e}[n mod N_k] (e = n / N_k,
// drawn from stream "data.shuffle.blend.<k>.<e>"). A blend has no epoch:
// num_samples() is 0 and position p is blend sample p.
//
// Documents (tokens, llmc, megatron; DocumentsConfig): a document boundary
// follows every eod_token (the EOD belongs to the document it ends; the next
// token starts a new one), as Megatron's --reset-position-ids and
// --reset-attention-mask find them. A megatron source without eod_token
// takes its boundaries from the .idx document index instead (the first
// token of every document starts one); with eod_token, the EOD tokens win
// and the index is not consulted. A window that starts inside a document
// counts that document's positions from the window's start. Documents
// returns each window's layout (DocumentLayout: what reset_position_ids and
// document_mask ask of the model); eod_mask_loss makes Targets drop every
// prediction from a document's last token (the EOD) of the next document's
// first, as Megatron's --eod-mask-loss does.
//
// Thread-safety: a DataSource is immutable after Create except for a cache of
// shuffle permutations, which is locked, and a count of bytes read per file
// (atomic), so Inputs, Targets and Documents may be called from several
// threads at once (each thread with a backend it alone drives, since backends
// are thread-compatible).
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
#include "engine/documents.h"
#include "engine/loss_kind.h"
#include "engine/tensor.h"

namespace conveyor::engine {

// Files at most this large are checked id by id at Create, so that a small
// bad file is refused before training starts; larger ones are checked
// window by window as they are read.
inline constexpr uint64_t kFullCheckBytes = uint64_t{64} << 20;

// How a tokens file stores each id (little-endian).
enum class TokenDType { kUint8, kUint16, kUint32, kInt32 };
// "uint8", "uint16", "uint32" or "int32"; InvalidArgument lists them.
absl::StatusOr<TokenDType> ParseTokenDType(absl::string_view name);
absl::string_view TokenDTypeName(TokenDType dtype);

// data.documents: document boundaries within the packed windows (see above).
struct DocumentsConfig {
  int64_t eod_token = -1;  // -1: none given
  bool reset_position_ids = false;
  bool document_mask = false;
  bool eod_mask_loss = false;
  bool enabled() const {
    return reset_position_ids || document_mask || eod_mask_loss;
  }
};

// At most this many data sets in one blend.
inline constexpr int kMaxBlendEntries = 4096;

// One data set of a megatron blend.
struct DataBlendEntry {
  std::string path;  // The prefix of PREFIX.bin and PREFIX.idx.
  double weight = 1.0;
};

// The `data:` section of a job. Fields other than kind, seed and shuffle apply
// to some kinds only, as marked; Create rejects a non-default value given to a
// kind it does not apply to, since that is most likely a mistake in the job.
struct DataConfig {
  enum class Kind { kSyntheticRegression, kTensors, kTokens, kLlmc, kMegatron };
  Kind kind = Kind::kSyntheticRegression;
  // Seeds the synthetic data and the shuffle permutations.
  uint64_t seed = 0;
  // tensors, tokens, llmc: the file to read; megatron: the prefix of
  // PREFIX.bin and PREFIX.idx (or give blend instead).
  std::string path = {};
  // megatron: two or more data sets mixed by weight, instead of path.
  std::vector<DataBlendEntry> blend = {};
  // Visit the samples of each epoch in a seeded random order (see above).
  bool shuffle = false;
  // tokens, llmc, megatron: tokens per sample; 0 takes the model's
  // input_shape[0].
  int64_t seq_len = 0;
  // tokens: how the file stores ids.
  TokenDType token_dtype = TokenDType::kUint8;
  // tokens, llmc, megatron: ids must be < vocab_size; 0 leaves the bound to
  // the model's vocabulary and to what the file's dtype can hold.
  int64_t vocab_size = 0;
  // tokens, llmc, megatron: document boundaries within windows.
  DocumentsConfig documents = {};
  // synthetic-regression: standard deviation of the noise added to y.
  double noise = 0.1;
  // synthetic-regression: the data set size N; 0 means unlimited (every
  // position is a fresh sample, and shuffle is meaningless).
  int64_t num_samples = 0;
};

// The kinds cut from a token stream: tokens, llmc, megatron.
bool IsTokenKind(DataConfig::Kind kind);

// The document structure of one microbatch's input windows, host side
// (engine/documents.h). Documents() fills it as the config asks: positions
// (row-major [rows, seq_len]) are each token's position within its
// document with reset_position_ids (0 at a document's first token in the
// window; a window that starts mid-document counts from the window start,
// as Megatron does), else t; segments are each token's document within its
// row with document_mask (from 0, non-decreasing), else 0. Two tokens may
// attend iff same row and same segment.
using DocumentLayout = MicrobatchDocuments;

// "synthetic-regression", "tensors", "tokens", "llmc" or "megatron".
// InvalidArgument lists the allowed names.
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
// synthetic-regression's float [..., in] -> [..., out] shapes, the token
// kinds' token input [seq_len] and integer targets. The job parser runs them
// to report a mismatch at the YAML's position; Create runs them too.
// InvalidArgument naming the field (as written in the YAML) and both values.
absl::Status CheckDataShapes(const DataConfig& config,
                             const SampleShapes& shapes);

// The checks of config.documents that need no file: documents only for the
// token kinds; eod_token -1 or in [0, vocabulary) (data.vocab_size, else the
// model's vocabulary); eod_token required for tokens and llmc when a
// documents flag is set (they have no document index). InvalidArgument
// naming the field.
absl::Status CheckDocuments(const DataConfig& config,
                            const SampleShapes& shapes);

class DataSource {
 public:
  virtual ~DataSource() = default;

  // Validates `config` against the model's `shapes` and opens any file.
  // Returns InvalidArgument naming the field and both values when they
  // disagree (synthetic-regression needs f32 inputs [..., in] and targets [...,
  // out] with the same leading dimensions; tensors needs x and y to match the
  // input and target shapes and types; the token kinds need [seq_len] token
  // inputs and [seq_len] integer targets), when a file is malformed (a bad
  // header or index, a size that disagrees with it, a directory or FIFO, an
  // empty file), too short for one window, or (when at most kFullCheckBytes)
  // holds an id outside the vocabulary; the errno-derived code (NotFound,
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
  // num_microbatches), step is negative or the positions overflow int64, or
  // a gathered token id is outside the vocabulary (naming the file and the
  // byte offset); FailedPrecondition if a file shrank since Create; the
  // backend's error (ResourceExhausted, ...) if it cannot hold the result.
  virtual absl::StatusOr<Tensor> Inputs(Backend* backend, int64_t step,
                                        int microbatch, int num_microbatches,
                                        int64_t batch_size) = 0;
  // The matching targets: [batch_size / num_microbatches, ...target], i64
  // for integer targets, else f32; with documents.eod_mask_loss,
  // kIgnoredTarget for every prediction that crosses into a new document
  // (target t where input token t ends its document: an EOD, as Megatron's
  // --eod-mask-loss drops the loss where the input is the EOD token).
  // Errors as for Inputs.
  virtual absl::StatusOr<Tensor> Targets(Backend* backend, int64_t step,
                                         int microbatch, int num_microbatches,
                                         int64_t batch_size) = 0;

  // The document layout of the rows Inputs returns for the same arguments;
  // an empty layout (rows == 0) when config.documents is not enabled().
  // Errors as for Inputs. This default, for sources without documents,
  // returns the empty layout.
  virtual absl::StatusOr<DocumentLayout> Documents(int64_t step, int microbatch,
                                                   int num_microbatches,
                                                   int64_t batch_size);

  // The data set size N (samples per epoch); 0 for unlimited.
  virtual int64_t num_samples() const = 0;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_DATA_H_
