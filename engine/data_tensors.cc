// The tensors data source (engine/data.h): samples are the rows of the
// tensors `x` and `y` of a safetensors file.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/data.h"
#include "engine/host_upload.h"
#include "engine/internal/data_sources.h"
#include "engine/safetensors.h"

namespace conveyor::engine::data_internal {
namespace {

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
    return UploadVector(
        backend, WithBatch(static_cast<int64_t>(samples.size()), shape), out);
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

}  // namespace

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

}  // namespace conveyor::engine::data_internal
