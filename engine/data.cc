#include "engine/data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cancellation.h"
#include "common/file.h"
#include "common/host_memory.h"
#include "common/status_macros.h"
#include "engine/cpu/parallel.h"
#include "engine/init.h"
#include "engine/safetensors.h"

namespace conveyor::engine {
namespace {

// Stream names for UniformDraw/NormalDraw. Distinct from any parameter name
// a model spec produces (those never start with "data."), so the data never
// correlates with the initial weights drawn from the same seed.
constexpr absl::string_view kWeightStream = "data.synthetic.weight";
constexpr absl::string_view kBiasStream = "data.synthetic.bias";
constexpr absl::string_view kXStream = "data.synthetic.x";
constexpr absl::string_view kNoiseStream = "data.synthetic.noise";

template <typename T>
absl::StatusOr<Tensor> Upload(Backend* backend, Shape shape,
                              const std::vector<T>& host) {
  ASSIGN_OR_RETURN(Tensor t, backend->Empty(shape, DTypeOf<T>()));
  RETURN_IF_ERROR(
      backend->CopyFromHost(host.data(), host.size() * sizeof(T), t));
  return t;
}

Shape WithBatch(int64_t rows, const std::vector<int64_t>& per_sample) {
  Shape shape = {rows};
  shape.insert(shape.end(), per_sample.begin(), per_sample.end());
  return shape;
}

// "[N, 2, 3]" for a per-sample shape [2, 3]: what a file must hold.
std::string PerSampleString(const std::vector<int64_t>& per_sample) {
  std::string out = "[N";
  for (int64_t d : per_sample) absl::StrAppend(&out, ", ", d);
  return absl::StrCat(out, "]");
}

// The Fisher-Yates permutation of [0, n) for `epoch`. Each swap index is a
// counter-based draw, so the permutation depends only on (seed, epoch, n).
std::vector<int64_t> EpochPermutation(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  const std::string stream = absl::StrCat("data.shuffle.", epoch);
  for (int64_t i = n - 1; i > 0; --i) {
    const double u = UniformDraw(seed, stream, static_cast<uint64_t>(i));
    // u < 1, but u * (i + 1) may round up to i + 1 for huge i.
    const int64_t j =
        std::min(i, static_cast<int64_t>(u * static_cast<double>(i + 1)));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

// What every kind shares: argument checks and the position -> sample map.
// Subclasses only gather given samples.
// Host buffers are sized by batch and sample shape; running out of memory
// is an outside failure, reported as such rather than thrown.
absl::Status OutOfMemory(absl::string_view what, size_t samples) {
  return absl::ResourceExhaustedError(
      absl::StrCat("data: not enough host memory to build the ", what, " of ",
                   samples, " samples"));
}

class IndexedDataSource : public DataSource {
 public:
  IndexedDataSource(int64_t num_samples, bool shuffle, uint64_t seed)
      : num_samples_(num_samples), shuffle_(shuffle), seed_(seed) {}

  absl::StatusOr<Tensor> Inputs(Backend* backend, int64_t step, int microbatch,
                                int num_microbatches,
                                int64_t batch_size) final {
    ASSIGN_OR_RETURN(std::vector<int64_t> samples,
                     Samples(step, microbatch, num_microbatches, batch_size));
    try {
      return GatherInputs(backend, samples);
    } catch (const std::bad_alloc&) {
      return OutOfMemory("inputs", samples.size());
    }
  }

  absl::StatusOr<Tensor> Targets(Backend* backend, int64_t step, int microbatch,
                                 int num_microbatches,
                                 int64_t batch_size) final {
    ASSIGN_OR_RETURN(std::vector<int64_t> samples,
                     Samples(step, microbatch, num_microbatches, batch_size));
    try {
      return GatherTargets(backend, samples);
    } catch (const std::bad_alloc&) {
      return OutOfMemory("targets", samples.size());
    }
  }

  int64_t num_samples() const final { return num_samples_; }

 protected:
  virtual absl::StatusOr<Tensor> GatherInputs(
      Backend* backend, const std::vector<int64_t>& samples) const = 0;
  virtual absl::StatusOr<Tensor> GatherTargets(
      Backend* backend, const std::vector<int64_t>& samples) const = 0;

 private:
  // Enough for one batch that straddles an epoch boundary, the common case;
  // a batch larger than an epoch just recomputes.
  static constexpr size_t kCachedEpochs = 2;

  absl::StatusOr<std::vector<int64_t>> Samples(int64_t step, int microbatch,
                                               int num_microbatches,
                                               int64_t batch_size) {
    if (batch_size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("data: batch_size must be positive, got ", batch_size));
    }
    if (num_microbatches <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data: num_microbatches must be positive, got ", num_microbatches));
    }
    if (batch_size % num_microbatches != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data: batch_size ", batch_size,
          " is not a multiple of num_microbatches ", num_microbatches));
    }
    if (microbatch < 0 || microbatch >= num_microbatches) {
      return absl::InvalidArgumentError(
          absl::StrCat("data: microbatch ", microbatch, " is outside [0, ",
                       num_microbatches, ")"));
    }
    if (step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("data: step must be non-negative, got ", step));
    }
    // (step + 1) * batch_size must fit, so that every position does.
    if (step > std::numeric_limits<int64_t>::max() / batch_size - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("data: step ", step, " times batch_size ", batch_size,
                       " overflows int64"));
    }
    const int64_t rows = batch_size / num_microbatches;
    const int64_t first = step * batch_size + microbatch * rows;
    std::vector<int64_t> samples(static_cast<size_t>(rows));
    const int64_t n = num_samples_;
    std::shared_ptr<const std::vector<int64_t>> perm;
    int64_t perm_epoch = -1;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = first + r;
      if (n == 0) {
        samples[r] = p;
      } else if (!shuffle_) {
        samples[r] = p % n;
      } else {
        const int64_t epoch = p / n;
        if (epoch != perm_epoch) {
          perm = Permutation(epoch);
          perm_epoch = epoch;
        }
        samples[r] = (*perm)[p % n];
      }
    }
    return samples;
  }

  std::shared_ptr<const std::vector<int64_t>> Permutation(int64_t epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [e, perm] : cache_) {
      if (e == epoch) return perm;
    }
    // Computed under the lock: concurrent callers almost always want the
    // same epoch, and computing it twice would waste more than the wait.
    auto perm = std::make_shared<const std::vector<int64_t>>(
        EpochPermutation(seed_, epoch, num_samples_));
    if (cache_.size() == kCachedEpochs) cache_.erase(cache_.begin());
    cache_.emplace_back(epoch, perm);
    return perm;
  }

  const int64_t num_samples_;
  const bool shuffle_;
  const uint64_t seed_;

  std::mutex mu_;
  // (epoch, permutation), oldest first. Guarded by mu_.
  std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>>
      cache_;
};

class SyntheticRegressionSource final : public IndexedDataSource {
 public:
  // Each sample is `rows` vectors of `in` features (rows = the product of the
  // input's leading dimensions; 1 for a 1-D input), each mapped through the
  // same W and b.
  SyntheticRegressionSource(const DataConfig& config,
                            const SampleShapes& shapes)
      : IndexedDataSource(config.num_samples, config.shuffle, config.seed),
        seed_(config.seed),
        rows_(NumElements(shapes.input) / shapes.input.back()),
        in_(shapes.input.back()),
        out_(shapes.target.back()),
        input_shape_(shapes.input),
        target_shape_(shapes.target),
        noise_(config.noise),
        params_(MakeSyntheticRegressionParams(config.seed, in_, out_)) {}

 protected:
  absl::StatusOr<Tensor> GatherInputs(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    const int64_t per_sample = rows_ * in_;
    std::vector<float> x(samples.size() * per_sample);
    ParallelForRows(static_cast<int64_t>(samples.size()), per_sample * 32,
                    [&](int64_t r) { X(samples[r], &x[r * per_sample]); });
    return Upload(backend,
                  Shape(static_cast<int64_t>(samples.size()), input_shape_), x);
  }

  absl::StatusOr<Tensor> GatherTargets(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    // The last stage never sees x, so it draws x again: cheaper than any
    // message, and identical since x is a pure function of the sample.
    // y is computed on the host in double with a fixed summation order, not
    // with the backend's GEMM, so that a sample's target is bit-identical
    // whatever the backend, the microbatch size or the thread count.
    const int64_t per_sample = rows_ * out_;
    std::vector<float> y(samples.size() * per_sample);
    ParallelForRows(
        static_cast<int64_t>(samples.size()), rows_ * in_ * out_,
        [&](int64_t r) {
          std::vector<float> x(rows_ * in_);
          X(samples[r], x.data());
          for (int64_t row = 0; row < rows_; ++row) {
            std::vector<double> sum(params_.bias.begin(), params_.bias.end());
            // i outer, k inner: contiguous in W, so the inner loop vectorizes
            // while each sum[k] still adds its terms in order i = 0, 1, ...
            for (int64_t i = 0; i < in_; ++i) {
              const double xi = x[row * in_ + i];
              const float* w = &params_.weight[i * out_];
              for (int64_t k = 0; k < out_; ++k) sum[k] += xi * w[k];
            }
            const uint64_t base =
                static_cast<uint64_t>(samples[r]) * per_sample + row * out_;
            float* out = &y[r * per_sample + row * out_];
            for (int64_t k = 0; k < out_; ++k) {
              if (noise_ != 0) {
                sum[k] += noise_ * NormalDraw(seed_, kNoiseStream, base + k);
              }
              out[k] = static_cast<float>(sum[k]);
            }
          }
        });
    return Upload(
        backend, Shape(static_cast<int64_t>(samples.size()), target_shape_), y);
  }

 private:
  // Leading dimension `batch`, then the per-sample shape.
  static std::vector<int64_t> Shape(int64_t batch,
                                    const std::vector<int64_t>& per_sample) {
    std::vector<int64_t> shape = {batch};
    shape.insert(shape.end(), per_sample.begin(), per_sample.end());
    return shape;
  }

  void X(int64_t sample, float* x) const {
    const uint64_t base = static_cast<uint64_t>(sample) * rows_ * in_;
    for (int64_t i = 0; i < rows_ * in_; ++i) {
      x[i] = static_cast<float>(NormalDraw(seed_, kXStream, base + i));
    }
  }

  const uint64_t seed_;
  const int64_t rows_, in_, out_;
  const std::vector<int64_t> input_shape_, target_shape_;  // Per sample.
  const double noise_;
  const SyntheticRegressionParams params_;
};

// Rows of one per-sample shape, held as f32 or i64.
struct SampleTable {
  std::vector<int64_t> shape;  // Per sample.
  int64_t row_size = 0;        // Elements per sample.
  bool integer = false;
  std::vector<float> f32;
  std::vector<int64_t> i64;

  template <typename T>
  absl::StatusOr<Tensor> Gather(Backend* backend, const std::vector<T>& table,
                                const std::vector<int64_t>& samples) const {
    std::vector<T> out(samples.size() * row_size);
    for (size_t r = 0; r < samples.size(); ++r) {
      std::copy_n(table.begin() + samples[r] * row_size, row_size,
                  out.begin() + r * row_size);
    }
    return Upload(backend,
                  WithBatch(static_cast<int64_t>(samples.size()), shape), out);
  }

  absl::StatusOr<Tensor> Gather(Backend* backend,
                                const std::vector<int64_t>& samples) const {
    return integer ? Gather(backend, i64, samples)
                   : Gather(backend, f32, samples);
  }
};

class TensorsSource final : public IndexedDataSource {
 public:
  TensorsSource(const DataConfig& config, int64_t n, SampleTable x,
                SampleTable y)
      : IndexedDataSource(n, config.shuffle, config.seed),
        x_(std::move(x)),
        y_(std::move(y)) {}

 protected:
  absl::StatusOr<Tensor> GatherInputs(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    return x_.Gather(backend, samples);
  }
  absl::StatusOr<Tensor> GatherTargets(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    return y_.Gather(backend, samples);
  }

 private:
  const SampleTable x_, y_;
};

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

// --- Create, per kind -------------------------------------------------------

// Rejects fields given to a kind they do not apply to.
absl::Status CheckUnusedFields(const DataConfig& config) {
  const DataConfig defaults;
  const absl::string_view kind = DataKindName(config.kind);
  auto unused = [&](absl::string_view field) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", field, " does not apply to data.source ", kind));
  };
  if (config.kind == DataConfig::Kind::kSyntheticRegression) {
    if (!config.path.empty()) return unused("path");
  } else {
    if (config.num_samples != defaults.num_samples) {
      return unused("num_samples");
    }
    if (config.noise != defaults.noise) return unused("noise");
  }
  if (config.kind != DataConfig::Kind::kTokens) {
    if (config.seq_len != defaults.seq_len) return unused("seq_len");
    if (config.uint16_tokens) return unused("uint16");
    if (config.vocab_size != defaults.vocab_size) return unused("vocab_size");
  }
  return absl::OkStatus();
}

// Everything CreateSyntheticRegression checks, without drawing W.
absl::Status CheckSyntheticRegression(const DataConfig& config,
                                      const SampleShapes& shapes) {
  if (!std::isfinite(config.noise) || config.noise < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.noise must be finite and non-negative, got ", config.noise));
  }
  if (config.num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.num_samples must be non-negative (0 = unlimited), "
                     "got ",
                     config.num_samples));
  }
  if (config.shuffle && config.num_samples == 0) {
    return absl::InvalidArgumentError(
        "data.shuffle needs a finite data set: set data.num_samples (0 means "
        "unlimited, where every sample is fresh anyway)");
  }
  // W is in x out floats, sized by the model: checked before it is made, so
  // a model too wide for this machine fails its job, not the process.
  const uint64_t in = static_cast<uint64_t>(shapes.input.back());
  const uint64_t out = static_cast<uint64_t>(shapes.target.back());
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(in, out, &bytes) ||
      __builtin_mul_overflow(bytes + out, sizeof(float), &bytes)) {
    bytes = ~uint64_t{0};
  }
  if (absl::Status s = CheckHostAllocation(
          bytes, absl::StrCat("data: synthetic-regression's W of ", in, " x ",
                              out, " floats"));
      !s.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(s.message(),
                     "; its sides are the model's input features (the last "
                     "of model.input_shape) and its output features (the "
                     "last layer's)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DataSource>> CreateSyntheticRegression(
    const DataConfig& config, const SampleShapes& shapes) {
  RETURN_IF_ERROR(CheckSyntheticRegression(config, shapes));
  auto source = std::make_unique<SyntheticRegressionSource>(config, shapes);
  // Drawing W takes seconds for a wide model; a job cancelled meanwhile
  // stops with an unfinished one.
  RETURN_IF_ERROR(CheckCancelled());
  return source;
}

// Reads tensor `name` of the file as a table of rows of `per_sample` shape.
absl::StatusOr<SampleTable> ReadTable(const SafetensorsReader& reader,
                                      absl::string_view name,
                                      absl::string_view role,
                                      const std::vector<int64_t>& per_sample,
                                      bool integer) {
  const TensorInfo* info = reader.Find(name);
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(reader.source_name(), ": no tensor '", name,
                     "' (data.source tensors needs 'x' and 'y')"));
  }
  if (IsFloatingPoint(info->dtype) == integer) {
    return absl::InvalidArgumentError(
        absl::StrCat(reader.source_name(), ": tensor '", name, "' has dtype ",
                     DTypeName(info->dtype), ", but the model's ", role,
                     " are ", integer ? "integer ids" : "floats"));
  }
  const std::vector<int64_t> file_per_sample =
      info->shape.empty()
          ? std::vector<int64_t>{}
          : std::vector<int64_t>(info->shape.begin() + 1, info->shape.end());
  if (info->shape.empty() || file_per_sample != per_sample) {
    return absl::InvalidArgumentError(
        absl::StrCat(reader.source_name(), ": tensor '", name, "' has shape ",
                     ShapeString(info->shape), ", but the model's ", role,
                     " need ", PerSampleString(per_sample)));
  }
  SampleTable table;
  table.shape = per_sample;
  table.row_size = NumElements(per_sample);
  table.integer = integer;
  if (integer) {
    ASSIGN_OR_RETURN(table.i64, reader.ReadI64(name));
  } else {
    ASSIGN_OR_RETURN(table.f32, reader.ReadF32(name));
  }
  return table;
}

absl::StatusOr<std::unique_ptr<DataSource>> CreateTensors(
    const DataConfig& config, const SampleShapes& shapes) {
  if (config.path.empty()) {
    return absl::InvalidArgumentError(
        "data.path is required for data.source tensors");
  }
  ASSIGN_OR_RETURN(SafetensorsReader reader,
                   SafetensorsReader::Open(config.path));
  ASSIGN_OR_RETURN(SampleTable x, ReadTable(reader, "x", "inputs", shapes.input,
                                            shapes.token_input));
  ASSIGN_OR_RETURN(
      SampleTable y,
      ReadTable(reader, "y", "targets", shapes.target, shapes.integer_targets));
  const int64_t n = reader.Find("x")->shape[0];
  const int64_t y_n = reader.Find("y")->shape[0];
  if (n != y_n) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.path, ": 'x' has ", n, " samples but 'y' has ", y_n,
                     "; the first dimensions must agree"));
  }
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.path, ": 'x' and 'y' hold no samples"));
  }
  return std::make_unique<TensorsSource>(config, n, std::move(x), std::move(y));
}

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

}  // namespace

absl::StatusOr<DataConfig::Kind> ParseDataKind(absl::string_view name) {
  if (name == "synthetic-regression") {
    return DataConfig::Kind::kSyntheticRegression;
  }
  if (name == "tensors") return DataConfig::Kind::kTensors;
  if (name == "tokens") return DataConfig::Kind::kTokens;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data source '", name,
                   "'; allowed: synthetic-regression, tensors, tokens"));
}

absl::string_view DataKindName(DataConfig::Kind kind) {
  switch (kind) {
    case DataConfig::Kind::kSyntheticRegression:
      return "synthetic-regression";
    case DataConfig::Kind::kTensors:
      return "tensors";
    case DataConfig::Kind::kTokens:
      return "tokens";
  }
  return "unknown";
}

SyntheticRegressionParams MakeSyntheticRegressionParams(uint64_t seed,
                                                        int64_t in_features,
                                                        int64_t out_features) {
  SyntheticRegressionParams params;
  params.weight.resize(in_features * out_features);
  params.bias.resize(out_features);
  // W ~ N(0, 1/in) keeps x W at unit variance whatever the width, so the
  // noise level means the same for every model and losses start near 1.
  const double w_std = 1.0 / std::sqrt(static_cast<double>(in_features));
  for (size_t i = 0; i < params.weight.size(); ++i) {
    // A cancelled job's W is left unfinished: CreateSyntheticRegression
    // discards it (common/cancellation.h).
    if (i % (size_t{1} << 16) == 0 && !CheckCancelled().ok()) break;
    params.weight[i] =
        static_cast<float>(w_std * NormalDraw(seed, kWeightStream, i));
  }
  for (size_t i = 0; i < params.bias.size(); ++i) {
    params.bias[i] = static_cast<float>(NormalDraw(seed, kBiasStream, i));
  }
  return params;
}

absl::Status CheckDataShapes(const DataConfig& config,
                             const SampleShapes& shapes) {
  switch (config.kind) {
    case DataConfig::Kind::kSyntheticRegression: {
      // Inputs [..., in] and targets [..., out] with the same leading
      // dimensions: y = x W + b along the last dimension.
      const bool same_leading =
          !shapes.input.empty() &&
          shapes.input.size() == shapes.target.size() &&
          std::equal(shapes.input.begin(), shapes.input.end() - 1,
                     shapes.target.begin());
      if (shapes.token_input || shapes.integer_targets || !same_leading) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.source synthetic-regression needs float inputs [..., in] and "
            "float targets [..., out] (loss: mse) with the same leading "
            "dimensions, but the model's input is ",
            shapes.token_input ? "token ids " : "", ShapeString(shapes.input),
            " and its target ", shapes.integer_targets ? "integer ids " : "",
            ShapeString(shapes.target)));
      }
      if (shapes.input.back() <= 0 || shapes.target.back() <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.source synthetic-regression needs positive "
                         "feature counts, got "
                         "input ",
                         ShapeString(shapes.input), " and target ",
                         ShapeString(shapes.target)));
      }
      return absl::OkStatus();
    }
    case DataConfig::Kind::kTensors:
      // x and y are checked against the model when the file is read.
      return absl::OkStatus();
    case DataConfig::Kind::kTokens: {
      if (!shapes.token_input || shapes.input.size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.source tokens needs a model with token-id input "
                         "[seq_len] (an "
                         "embedding first), but the model's input is ",
                         shapes.token_input ? "token ids " : "floats ",
                         ShapeString(shapes.input)));
      }
      if (config.seq_len < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.seq_len must be positive (or 0 for the model's "
                         "input_shape[0]), "
                         "got ",
                         config.seq_len));
      }
      const int64_t seq_len =
          config.seq_len == 0 ? shapes.input[0] : config.seq_len;
      if (seq_len != shapes.input[0]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.seq_len is ", seq_len, " but the model's input_shape[0] is ",
            shapes.input[0]));
      }
      if (seq_len <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.seq_len must be positive, got ", seq_len));
      }
      if (!shapes.integer_targets || shapes.target != std::vector{seq_len}) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.source tokens gives integer targets [", seq_len,
                         "] (loss: cross_entropy), but the model's target is ",
                         shapes.integer_targets ? "integer ids " : "floats ",
                         ShapeString(shapes.target)));
      }
      // Checked now: an id the model has no row for would otherwise fail
      // the job at its first use, hours in.
      if (shapes.vocab > 0 && config.vocab_size > shapes.vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.vocab_size is ", config.vocab_size,
            " but the model's vocabulary is ", shapes.vocab,
            " (its embedding's vocab_size and its output's classes): ids "
            "from ",
            shapes.vocab, " up would fail the job when first met"));
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("data.source: unknown source");
}

absl::Status DataSource::Check(const DataConfig& config,
                               const SampleShapes& shapes) {
  if (config.kind == DataConfig::Kind::kSyntheticRegression) {
    RETURN_IF_ERROR(CheckUnusedFields(config));
    RETURN_IF_ERROR(CheckDataShapes(config, shapes));
    return CheckSyntheticRegression(config, shapes);
  }
  // The file sources' checks are their reads.
  return Create(config, shapes).status();
}

absl::StatusOr<std::unique_ptr<DataSource>> DataSource::Create(
    const DataConfig& config, const SampleShapes& shapes) {
  RETURN_IF_ERROR(CheckUnusedFields(config));
  RETURN_IF_ERROR(CheckDataShapes(config, shapes));
  switch (config.kind) {
    case DataConfig::Kind::kSyntheticRegression:
      return CreateSyntheticRegression(config, shapes);
    case DataConfig::Kind::kTensors:
      return CreateTensors(config, shapes);
    case DataConfig::Kind::kTokens:
      return CreateTokens(config, shapes);
  }
  return absl::InvalidArgumentError("data.source: unknown source");
}

}  // namespace conveyor::engine
