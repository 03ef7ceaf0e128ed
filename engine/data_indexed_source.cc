// SampleOrder and IndexedDataSource (engine/internal/data_sources.h): the
// checks and the position -> sample map every data source kind shares, with
// the cache of shuffle permutations.
#include <algorithm>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/init.h"
#include "engine/internal/data_sources.h"

namespace conveyor::engine::data_internal {
namespace {

// Host buffers are sized by batch and sample shape; running out of memory
// is an outside failure, reported as such rather than thrown.
absl::Status OutOfMemory(absl::string_view what, size_t samples) {
  return absl::ResourceExhaustedError(
      absl::StrCat("data: not enough host memory to build the ", what, " of ",
                   samples, " samples"));
}

// The Fisher-Yates permutation of [0, n) for `epoch`. Each swap index is a
// counter-based draw, so the permutation depends only on (seed, stream
// prefix, epoch, n).
std::vector<int64_t> EpochPermutation(uint64_t seed, absl::string_view prefix,
                                      int64_t epoch, int64_t n) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  const std::string stream = absl::StrCat(prefix, epoch);
  for (int64_t i = n - 1; i > 0; --i) {
    const double u = UniformDraw(seed, stream, static_cast<uint64_t>(i));
    // u < 1, but u * (i + 1) may round up to i + 1 for huge i.
    const int64_t j =
        std::min(i, static_cast<int64_t>(u * static_cast<double>(i + 1)));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

}  // namespace

absl::StatusOr<Tensor> IndexedDataSource::Inputs(Backend* backend, int64_t step,
                                                 int microbatch,
                                                 int num_microbatches,
                                                 int64_t batch_size) {
  ASSIGN_OR_RETURN(std::vector<int64_t> samples,
                   Samples(step, microbatch, num_microbatches, batch_size));
  try {
    return GatherInputs(backend, samples);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("inputs", samples.size());
  }
}

absl::StatusOr<Tensor> IndexedDataSource::Targets(Backend* backend,
                                                  int64_t step, int microbatch,
                                                  int num_microbatches,
                                                  int64_t batch_size) {
  ASSIGN_OR_RETURN(std::vector<int64_t> samples,
                   Samples(step, microbatch, num_microbatches, batch_size));
  try {
    return GatherTargets(backend, samples);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("targets", samples.size());
  }
}

absl::StatusOr<std::vector<int64_t>> IndexedDataSource::Samples(
    int64_t step, int microbatch, int num_microbatches, int64_t batch_size) {
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
  order_.Samples(first, rows, samples.data());
  return samples;
}

absl::StatusOr<DocumentLayout> IndexedDataSource::Documents(
    int64_t step, int microbatch, int num_microbatches, int64_t batch_size) {
  ASSIGN_OR_RETURN(std::vector<int64_t> samples,
                   Samples(step, microbatch, num_microbatches, batch_size));
  try {
    return GatherDocuments(samples);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("document layout", samples.size());
  }
}

absl::StatusOr<DocumentLayout> IndexedDataSource::GatherDocuments(
    const std::vector<int64_t>& /*samples*/) const {
  return DocumentLayout{};
}

void SampleOrder::Samples(int64_t first, int64_t count, int64_t* out) {
  const int64_t n = n_;
  std::shared_ptr<const std::vector<int64_t>> perm;
  int64_t perm_epoch = -1;
  for (int64_t r = 0; r < count; ++r) {
    const int64_t p = first + r;
    if (n == 0) {
      out[r] = p;
    } else if (!shuffle_) {
      out[r] = p % n;
    } else {
      const int64_t epoch = p / n;
      if (epoch != perm_epoch) {
        perm = Permutation(epoch);
        perm_epoch = epoch;
      }
      out[r] = (*perm)[p % n];
    }
  }
}

std::shared_ptr<const std::vector<int64_t>> SampleOrder::Permutation(
    int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [e, perm] : cache_) {
    if (e == epoch) return perm;
  }
  // Computed under the lock: concurrent callers almost always want the
  // same epoch, and computing it twice would waste more than the wait.
  auto perm = std::make_shared<const std::vector<int64_t>>(
      EpochPermutation(seed_, stream_prefix_, epoch, n_));
  if (cache_.size() == kCachedEpochs) cache_.erase(cache_.begin());
  cache_.emplace_back(epoch, perm);
  return perm;
}

}  // namespace conveyor::engine::data_internal
