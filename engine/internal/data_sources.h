// What the data source kinds (engine/data_synthetic.cc, data_tensors.cc,
// data_tokens.cc, data_llmc.cc, data_megatron.cc) share, and the factories
// DataSource::Create (engine/data.cc) dispatches to.
//
// SampleOrder maps a position to a sample index of a data set (engine/
// data.h), with the shuffle permutations cached. IndexedDataSource holds
// what every kind has in common: the argument checks of Inputs, Targets and
// Documents and one SampleOrder; a kind only gathers given samples.
// Thread-safety: as DataSource's; the permutation caches are locked.
//
// Not API: only engine/data*.cc include this.
#ifndef CONVEYOR_ENGINE_INTERNAL_DATA_SOURCES_H_
#define CONVEYOR_ENGINE_INTERNAL_DATA_SOURCES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "engine/backend.h"
#include "engine/data.h"
#include "engine/tensor.h"

namespace conveyor::engine::data_internal {

// Position p -> sample index of a data set of n samples: p when n is 0
// (unlimited), p mod n without shuffle, else perm_e[p mod n] with e = p / n
// and perm_e the Fisher-Yates permutation drawn from stream
// "<stream_prefix><e>" (engine/data.h).
class SampleOrder {
 public:
  SampleOrder(int64_t n, bool shuffle, uint64_t seed, std::string stream_prefix)
      : n_(n),
        shuffle_(shuffle && n > 0),
        seed_(seed),
        stream_prefix_(std::move(stream_prefix)) {}

  int64_t n() const { return n_; }

  // The samples at positions [first, first + count) (first >= 0, and
  // first + count must not overflow) into out[0, count).
  void Samples(int64_t first, int64_t count, int64_t* out);

 private:
  // Enough for one batch that straddles an epoch boundary, the common case;
  // a batch larger than an epoch just recomputes.
  static constexpr size_t kCachedEpochs = 2;

  std::shared_ptr<const std::vector<int64_t>> Permutation(int64_t epoch);

  const int64_t n_;
  const bool shuffle_;
  const uint64_t seed_;
  const std::string stream_prefix_;

  std::mutex mu_;
  // (epoch, permutation), oldest first. Guarded by mu_.
  std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>>
      cache_;
};

// What every kind shares: argument checks and the position -> sample map.
// Subclasses only gather given samples.
class IndexedDataSource : public DataSource {
 public:
  IndexedDataSource(int64_t num_samples, bool shuffle, uint64_t seed)
      : order_(num_samples, shuffle, seed, "data.shuffle.") {}

  absl::StatusOr<Tensor> Inputs(Backend* backend, int64_t step, int microbatch,
                                int num_microbatches, int64_t batch_size) final;
  absl::StatusOr<Tensor> Targets(Backend* backend, int64_t step, int microbatch,
                                 int num_microbatches,
                                 int64_t batch_size) final;
  absl::StatusOr<DocumentLayout> Documents(int64_t step, int microbatch,
                                           int num_microbatches,
                                           int64_t batch_size) final;

  int64_t num_samples() const final { return order_.n(); }

 protected:
  virtual absl::StatusOr<Tensor> GatherInputs(
      Backend* backend, const std::vector<int64_t>& samples) const = 0;
  virtual absl::StatusOr<Tensor> GatherTargets(
      Backend* backend, const std::vector<int64_t>& samples) const = 0;
  // The layout of the samples' inputs; by default the empty layout (a kind
  // without documents).
  virtual absl::StatusOr<DocumentLayout> GatherDocuments(
      const std::vector<int64_t>& samples) const;

 private:
  absl::StatusOr<std::vector<int64_t>> Samples(int64_t step, int microbatch,
                                               int num_microbatches,
                                               int64_t batch_size);

  SampleOrder order_;
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
// engine/data_llmc.cc
absl::StatusOr<std::unique_ptr<DataSource>> CreateLlmc(
    const DataConfig& config, const SampleShapes& shapes);
// engine/data_megatron.cc
absl::StatusOr<std::unique_ptr<DataSource>> CreateMegatron(
    const DataConfig& config, const SampleShapes& shapes);

}  // namespace conveyor::engine::data_internal

#endif  // CONVEYOR_ENGINE_INTERNAL_DATA_SOURCES_H_
