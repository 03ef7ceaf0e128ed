// IndexedDataSource (engine/internal/data_sources.h), the base every data
// source kind gathers through: its argument checks, the position -> sample
// map with and without shuffle, and the out-of-memory report. The kinds'
// own tests are in data_test.cc.
#include <algorithm>
#include <cstdint>
#include <new>
#include <numeric>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/host_upload.h"
#include "engine/internal/data_sources.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::engine::data_internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Backend* Cpu() { return CpuBackend::Get(); }

// Inputs are the sample indices themselves; targets throw bad_alloc when
// asked to, as a kind's host buffers may.
class IndexSource final : public IndexedDataSource {
 public:
  IndexSource(int64_t num_samples, bool shuffle, uint64_t seed,
              bool targets_throw = false)
      : IndexedDataSource(num_samples, shuffle, seed),
        targets_throw_(targets_throw) {}

 protected:
  absl::StatusOr<Tensor> GatherInputs(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    return UploadVector(backend, {static_cast<int64_t>(samples.size())},
                        samples);
  }
  absl::StatusOr<Tensor> GatherTargets(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    if (targets_throw_) throw std::bad_alloc();
    return GatherInputs(backend, samples);
  }

 private:
  const bool targets_throw_;
};

std::vector<int64_t> Samples(DataSource& source, int64_t step, int microbatch,
                             int num_microbatches, int64_t batch_size) {
  absl::StatusOr<Tensor> t =
      source.Inputs(Cpu(), step, microbatch, num_microbatches, batch_size);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  std::vector<int64_t> v(t->numel());
  EXPECT_TRUE(Cpu()->CopyToHost(*t, v.data(), v.size() * sizeof(int64_t)).ok());
  return v;
}

TEST(IndexedDataSourceTest, UnlimitedDataMapsEachPositionToItsOwnSample) {
  IndexSource source(/*num_samples=*/0, /*shuffle=*/false, /*seed=*/1);
  EXPECT_EQ(source.num_samples(), 0);
  EXPECT_THAT(Samples(source, 3, 1, 2, 4), ElementsAre(14, 15));
}

TEST(IndexedDataSourceTest, WithoutShufflePositionsWrapModuloN) {
  IndexSource source(5, false, 1);
  EXPECT_THAT(Samples(source, 0, 0, 1, 4), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Samples(source, 1, 0, 1, 4), ElementsAre(4, 0, 1, 2));
  EXPECT_THAT(Samples(source, 2, 0, 1, 4), ElementsAre(3, 4, 0, 1));
}

TEST(IndexedDataSourceTest, ShuffleVisitsEverySampleOncePerEpoch) {
  constexpr int64_t kN = 7;
  IndexSource source(kN, true, 42);
  // Batches of 3 straddle epoch boundaries; 7 steps cover 3 whole epochs.
  std::vector<int64_t> positions;
  for (int64_t step = 0; step < 7; ++step) {
    for (int64_t s : Samples(source, step, 0, 1, 3)) positions.push_back(s);
  }
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> seen(positions.begin() + epoch * kN,
                              positions.begin() + (epoch + 1) * kN);
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(kN);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << "epoch " << epoch;
  }
  // A fresh source (no cached permutations) with the same seed agrees,
  // read in another order: the order depends on nothing but the seed.
  IndexSource again(kN, true, 42);
  EXPECT_EQ(Samples(again, 6, 0, 1, 3),
            std::vector<int64_t>(positions.begin() + 18, positions.end()));
  EXPECT_EQ(Samples(again, 0, 0, 1, 3),
            std::vector<int64_t>(positions.begin(), positions.begin() + 3));
}

TEST(IndexedDataSourceTest, MicrobatchesAreContiguousSlicesOfTheBatch) {
  IndexSource source(11, true, 7);
  const std::vector<int64_t> whole = Samples(source, 2, 0, 1, 8);
  std::vector<int64_t> sliced;
  for (int mb = 0; mb < 4; ++mb) {
    for (int64_t s : Samples(source, 2, mb, 4, 8)) sliced.push_back(s);
  }
  EXPECT_EQ(sliced, whole);
}

TEST(IndexedDataSourceTest, RejectsBadBatchArguments) {
  IndexSource source(5, false, 1);
  struct Case {
    int64_t step;
    int microbatch, num_microbatches;
    int64_t batch_size;
    const char* message;
  };
  for (const Case& c : {
           Case{0, 0, 1, 0, "batch_size must be positive"},
           Case{0, 0, 0, 4, "num_microbatches must be positive"},
           Case{0, 0, 3, 4, "is not a multiple of num_microbatches"},
           Case{0, 2, 2, 4, "is outside [0, 2)"},
           Case{-1, 0, 1, 4, "step must be non-negative"},
           Case{INT64_MAX / 2, 0, 1, 4, "overflows int64"},
       }) {
    absl::StatusOr<Tensor> t = source.Targets(Cpu(), c.step, c.microbatch,
                                              c.num_microbatches, c.batch_size);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument)
        << c.message;
    EXPECT_THAT(t.status().message(), HasSubstr(c.message));
  }
}

TEST(IndexedDataSourceTest, HostOutOfMemoryIsResourceExhaustedNotThrown) {
  IndexSource source(5, false, 1, /*targets_throw=*/true);
  absl::StatusOr<Tensor> t = source.Targets(Cpu(), 0, 0, 2, 4);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(t.status().message(),
              HasSubstr("not enough host memory to build the targets of 2 "
                        "samples"));
  // Inputs gather without throwing.
  EXPECT_THAT(Samples(source, 0, 1, 2, 4), ElementsAre(2, 3));
}

}  // namespace
}  // namespace conveyor::engine::data_internal
