// What the data source kinds (engine/data_synthetic.cc, data_tensors.cc,
// data_tokens.cc) share, and the factories DataSource::Create
// (engine/data.cc) dispatches to.
//
// IndexedDataSource holds what every kind has in common: the argument checks
// of Inputs and Targets and the map from a batch position to a sample index
// (engine/data.h), with the shuffle permutations cached; a kind only gathers
// given samples. Thread-safety: as DataSource's; the permutation cache is
// locked.
//
// Not API: only engine/data*.cc include this.
#ifndef CONVEYOR_ENGINE_INTERNAL_DATA_SOURCES_H_
#define CONVEYOR_ENGINE_INTERNAL_DATA_SOURCES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "engine/backend.h"
#include "engine/data.h"
#include "engine/tensor.h"

namespace conveyor::engine::data_internal {

// A tensor of `shape` on `backend` holding `host`.
template <typename T>
absl::StatusOr<Tensor> Upload(Backend* backend, Shape shape,
                              const std::vector<T>& host) {
  ASSIGN_OR_RETURN(Tensor t, backend->Empty(shape, DTypeOf<T>()));
  RETURN_IF_ERROR(
      backend->CopyFromHost(host.data(), host.size() * sizeof(T), t));
  return t;
}

// What every kind shares: argument checks and the position -> sample map.
// Subclasses only gather given samples.
class IndexedDataSource : public DataSource {
 public:
  IndexedDataSource(int64_t num_samples, bool shuffle, uint64_t seed)
      : num_samples_(num_samples), shuffle_(shuffle), seed_(seed) {}

  absl::StatusOr<Tensor> Inputs(Backend* backend, int64_t step, int microbatch,
                                int num_microbatches, int64_t batch_size) final;
  absl::StatusOr<Tensor> Targets(Backend* backend, int64_t step, int microbatch,
                                 int num_microbatches,
                                 int64_t batch_size) final;

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
                                               int64_t batch_size);
  std::shared_ptr<const std::vector<int64_t>> Permutation(int64_t epoch);

  const int64_t num_samples_;
  const bool shuffle_;
  const uint64_t seed_;

  std::mutex mu_;
  // (epoch, permutation), oldest first. Guarded by mu_.
  std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>>
      cache_;
};

// The kinds' factories, each behind DataSource::Create's common checks
// (unused fields, CheckDataShapes).

// Everything CreateSyntheticRegression checks, without drawing W
// (engine/data_synthetic.cc).
absl::Status CheckSyntheticRegression(const DataConfig& config,
                                      const SampleShapes& shapes);
absl::StatusOr<std::unique_ptr<DataSource>> CreateSyntheticRegression(
    const DataConfig& config, const SampleShapes& shapes);
// engine/data_tensors.cc
absl::StatusOr<std::unique_ptr<DataSource>> CreateTensors(
    const DataConfig& config, const SampleShapes& shapes);
// engine/data_tokens.cc
absl::StatusOr<std::unique_ptr<DataSource>> CreateTokens(
    const DataConfig& config, const SampleShapes& shapes);

}  // namespace conveyor::engine::data_internal

#endif  // CONVEYOR_ENGINE_INTERNAL_DATA_SOURCES_H_
