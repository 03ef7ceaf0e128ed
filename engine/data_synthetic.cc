// The synthetic-regression data source (engine/data.h): y = x W + b +
// noise, with W, b, x and the noise drawn from the seed so that every sample
// is a pure function of (seed, sample index).
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cancellation.h"
#include "common/host_memory.h"
#include "common/status_macros.h"
#include "engine/cpu/parallel.h"
#include "engine/data.h"
#include "engine/host_upload.h"
#include "engine/init.h"
#include "engine/internal/data_sources.h"

namespace conveyor::engine {
namespace {

// Stream names for UniformDraw/NormalDraw. Distinct from any parameter name
// a model spec produces (those never start with "data."), so the data never
// correlates with the initial weights drawn from the same seed.
constexpr absl::string_view kWeightStream = "data.synthetic.weight";
constexpr absl::string_view kBiasStream = "data.synthetic.bias";
constexpr absl::string_view kXStream = "data.synthetic.x";
constexpr absl::string_view kNoiseStream = "data.synthetic.noise";

using data_internal::IndexedDataSource;

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
    return UploadVector(
        backend, Shape(static_cast<int64_t>(samples.size()), input_shape_), x);
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
    return UploadVector(
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

}  // namespace

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

namespace data_internal {

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

}  // namespace data_internal
}  // namespace conveyor::engine
