#include "engine/data.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "common/cancellation.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::AllClose;
using testing_util::ToVector;

Backend* Cpu() { return CpuBackend::Get(); }

std::vector<int64_t> ToI64(const Tensor& t) {
  std::vector<int64_t> v(t.numel());
  EXPECT_EQ(t.dtype(), DType::kI64);
  EXPECT_TRUE(Cpu()->CopyToHost(t, v.data(), v.size() * 8).ok());
  return v;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/data_test_" + name;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

std::string Uint16File(const std::vector<uint16_t>& tokens) {
  std::string bytes;
  for (uint16_t t : tokens) {
    bytes.push_back(static_cast<char>(t & 0xFF));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  return bytes;
}

// Inputs and targets of one microbatch, as host vectors.
struct Batch {
  Shape input_shape, target_shape;
  std::vector<float> x, y;      // Float inputs / targets.
  std::vector<int64_t> xi, yi;  // Integer inputs / targets.
};

Batch Fetch(DataSource& source, int64_t step, int microbatch, int num_mb,
            int64_t batch_size) {
  Batch b;
  absl::StatusOr<Tensor> x =
      source.Inputs(Cpu(), step, microbatch, num_mb, batch_size);
  absl::StatusOr<Tensor> y =
      source.Targets(Cpu(), step, microbatch, num_mb, batch_size);
  EXPECT_TRUE(x.ok()) << x.status();
  EXPECT_TRUE(y.ok()) << y.status();
  if (!x.ok() || !y.ok()) return b;
  b.input_shape = x->shape();
  b.target_shape = y->shape();
  if (x->dtype() == DType::kI64) {
    b.xi = ToI64(*x);
  } else {
    b.x = ToVector(*x);
  }
  if (y->dtype() == DType::kI64) {
    b.yi = ToI64(*y);
  } else {
    b.y = ToVector(*y);
  }
  return b;
}

template <typename T>
std::vector<T> Slice(const std::vector<T>& v, int64_t begin, int64_t end) {
  return std::vector<T>(v.begin() + begin, v.begin() + end);
}

// Checks that microbatch j of `num_mb` holds rows [j*b, (j+1)*b) of the
// whole batch fetched at once, for inputs and targets.
void ExpectSplitIndependent(DataSource& source, int64_t step,
                            int64_t batch_size, int num_mb) {
  const Batch whole = Fetch(source, step, 0, 1, batch_size);
  const int64_t rows = batch_size / num_mb;
  const auto row_elems = [](const auto& v, int64_t n) {
    return static_cast<int64_t>(v.size()) / n;
  };
  for (int j = 0; j < num_mb; ++j) {
    const Batch part = Fetch(source, step, j, num_mb, batch_size);
    ASSERT_FALSE(part.input_shape.empty());
    EXPECT_EQ(part.input_shape[0], rows);
    EXPECT_EQ(part.target_shape[0], rows);
    if (!whole.x.empty()) {
      const int64_t e = row_elems(whole.x, batch_size);
      EXPECT_EQ(part.x, Slice(whole.x, j * rows * e, (j + 1) * rows * e))
          << "microbatch " << j << " of " << num_mb;
    } else {
      const int64_t e = row_elems(whole.xi, batch_size);
      EXPECT_EQ(part.xi, Slice(whole.xi, j * rows * e, (j + 1) * rows * e))
          << "microbatch " << j << " of " << num_mb;
    }
    if (!whole.y.empty()) {
      const int64_t e = row_elems(whole.y, batch_size);
      EXPECT_EQ(part.y, Slice(whole.y, j * rows * e, (j + 1) * rows * e))
          << "microbatch " << j << " of " << num_mb;
    } else {
      const int64_t e = row_elems(whole.yi, batch_size);
      EXPECT_EQ(part.yi, Slice(whole.yi, j * rows * e, (j + 1) * rows * e))
          << "microbatch " << j << " of " << num_mb;
    }
  }
}

std::unique_ptr<DataSource> MustCreate(const DataConfig& config,
                                       const SampleShapes& shapes) {
  absl::StatusOr<std::unique_ptr<DataSource>> source =
      DataSource::Create(config, shapes);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *std::move(source) : nullptr;
}

absl::Status CreateError(const DataConfig& config, const SampleShapes& shapes) {
  return DataSource::Create(config, shapes).status();
}

// --- Kind names
// ---------------------------------------------------------------

TEST(ParseDataKindTest, RoundTripsEveryKind) {
  for (DataConfig::Kind kind :
       {DataConfig::Kind::kSyntheticRegression, DataConfig::Kind::kTensors,
        DataConfig::Kind::kTokens}) {
    absl::StatusOr<DataConfig::Kind> parsed = ParseDataKind(DataKindName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(*ParseDataKind("synthetic-regression"),
            DataConfig::Kind::kSyntheticRegression);
}

TEST(ParseDataKindTest, UnknownNameListsAllowedNames) {
  absl::Status status = ParseDataKind("synthetic").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'synthetic'"));
  EXPECT_THAT(status.message(),
              HasSubstr("synthetic-regression, tensors, tokens"));
}

// --- synthetic-regression
// -----------------------------------------------------

DataConfig Synthetic(uint64_t seed = 3, double noise = 0.1) {
  DataConfig config;
  config.kind = DataConfig::Kind::kSyntheticRegression;
  config.seed = seed;
  config.noise = noise;
  return config;
}

const SampleShapes kRegression = {.input = {4},
                                  .token_input = false,
                                  .target = {3},
                                  .integer_targets = false};

// A model 1,000,000 wide in and out asks for a W of 10^12 floats: once a
// std::bad_alloc that terminated every worker, now the job's error.
TEST(SyntheticRegressionTest, AWTooLargeForThisMachineIsRefusedNotAllocated) {
  const SampleShapes huge = {.input = {1000000},
                             .token_input = false,
                             .target = {1000000},
                             .integer_targets = false};
  const absl::Status status = CreateError(Synthetic(), huge);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(),
              HasSubstr("data: synthetic-regression's W of 1000000 x 1000000 "
                        "floats needs 3.6 TiB of host memory"));
  EXPECT_THAT(status.message(), HasSubstr("the last of model.input_shape"));
}

// Drawing a wide model's W takes seconds: a job cancelled meanwhile gets
// its cancel, not a data source.
TEST(SyntheticRegressionTest, CreateStopsWhenTheCallingJobIsCancelled) {
  Cancellation cancellation;
  CancellationScope scope(&cancellation);
  EXPECT_TRUE(DataSource::Create(Synthetic(), kRegression).ok());
  cancellation.Cancel(absl::CancelledError("job cancelled"));
  EXPECT_EQ(CreateError(Synthetic(), kRegression),
            absl::CancelledError("job cancelled"));
}

TEST(SyntheticRegressionTest, SameArgumentsGiveIdenticalTensors) {
  auto a = MustCreate(Synthetic(), kRegression);
  auto b = MustCreate(Synthetic(), kRegression);
  ASSERT_TRUE(a && b);
  const Batch first = Fetch(*a, 5, 1, 2, 8);
  const Batch again = Fetch(*a, 5, 1, 2, 8);
  const Batch other = Fetch(*b, 5, 1, 2, 8);
  EXPECT_THAT(first.input_shape, ElementsAre(4, 4));
  EXPECT_THAT(first.target_shape, ElementsAre(4, 3));
  EXPECT_EQ(first.x, again.x);
  EXPECT_EQ(first.y, again.y);
  EXPECT_EQ(first.x, other.x);
  EXPECT_EQ(first.y, other.y);
  EXPECT_EQ(a->num_samples(), 0);

  // Another seed or step gives other samples.
  auto c = MustCreate(Synthetic(4), kRegression);
  ASSERT_TRUE(c);
  EXPECT_NE(first.x, Fetch(*c, 5, 1, 2, 8).x);
  EXPECT_NE(first.x, Fetch(*a, 6, 1, 2, 8).x);
}

TEST(SyntheticRegressionTest, MicrobatchesAreSlicesOfTheBatch) {
  auto source = MustCreate(Synthetic(), kRegression);
  ASSERT_TRUE(source);
  for (int num_mb : {1, 2, 4, 8}) ExpectSplitIndependent(*source, 3, 8, num_mb);
}

TEST(SyntheticRegressionTest, SampleDependsOnlyOnItsGlobalPosition) {
  auto source = MustCreate(Synthetic(), kRegression);
  ASSERT_TRUE(source);
  // Positions 6..11 with batch 6 at step 1; positions 6..8 with batch 3 at
  // step 2.
  const Batch big = Fetch(*source, 1, 0, 1, 6);
  const Batch small = Fetch(*source, 2, 0, 1, 3);
  EXPECT_EQ(small.x, Slice(big.x, 0, 3 * 4));
  EXPECT_EQ(small.y, Slice(big.y, 0, 3 * 3));
}

// Reference: y = x W + b + noise for each row, from the exposed parameters.
std::vector<double> Residuals(const Batch& b, uint64_t seed, int64_t in,
                              int64_t out) {
  const SyntheticRegressionParams p =
      MakeSyntheticRegressionParams(seed, in, out);
  const int64_t rows = static_cast<int64_t>(b.x.size()) / in;
  std::vector<double> residuals;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < out; ++k) {
      double sum = p.bias[k];
      for (int64_t i = 0; i < in; ++i) {
        sum += static_cast<double>(b.x[r * in + i]) * p.weight[i * out + k];
      }
      residuals.push_back(b.y[r * out + k] - sum);
    }
  }
  return residuals;
}

TEST(SyntheticRegressionTest, WithoutNoiseTargetsAreExactlyLinear) {
  auto source = MustCreate(Synthetic(11, 0.0), kRegression);
  ASSERT_TRUE(source);
  const Batch b = Fetch(*source, 2, 0, 1, 16);
  for (double r : Residuals(b, 11, 4, 3)) EXPECT_NEAR(r, 0.0, 1e-5);
  // And the truth is not trivial: W and b are random draws, not zeros.
  const SyntheticRegressionParams p = MakeSyntheticRegressionParams(11, 4, 3);
  EXPECT_EQ(p.weight.size(), 12u);
  EXPECT_EQ(p.bias.size(), 3u);
  EXPECT_GT(std::abs(p.weight[0]) + std::abs(p.bias[0]), 0.0f);
  // W ~ N(0, 1/in): at width 400 its variance is 1/400, so y = x W has unit
  // variance per output.
  const SyntheticRegressionParams wide =
      MakeSyntheticRegressionParams(3, 400, 50);
  double sq = 0;
  for (float w : wide.weight) sq += static_cast<double>(w) * w;
  EXPECT_NEAR(sq / wide.weight.size(), 1.0 / 400, 0.1 / 400);
  EXPECT_NE(p.weight, MakeSyntheticRegressionParams(12, 4, 3).weight);
}

// Resident pages of this process, in bytes.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// Cancelling a job whose W is 4 GB once left its workers busy for 10 s:
// the vector was zero-filled in full before the draw's first poll. A
// cancelled draw now touches (almost) none of it.
TEST(SyntheticRegressionTest, ACancelledDrawDoesNotFillItsBuffer) {
  Cancellation cancellation;
  cancellation.Cancel(absl::CancelledError("job cancelled"));
  CancellationScope scope(&cancellation);
  const int64_t before = ResidentBytes();
  const SyntheticRegressionParams p =
      MakeSyntheticRegressionParams(1, 16384, 8192);  // 512 MiB of W
  EXPECT_EQ(p.weight.size(), size_t{16384} * 8192);
  EXPECT_LT(ResidentBytes() - before, int64_t{64} << 20);
}

TEST(SyntheticRegressionTest, NoiseHasTheRequestedDeviation) {
  auto source = MustCreate(Synthetic(5, 0.1), kRegression);
  ASSERT_TRUE(source);
  // The last stage's targets match the first stage's inputs up to noise.
  const Batch b = Fetch(*source, 0, 0, 1, 4000);
  const std::vector<double> r = Residuals(b, 5, 4, 3);
  double mean = 0, sq = 0;
  for (double v : r) {
    mean += v;
    sq += v * v;
  }
  mean /= static_cast<double>(r.size());
  const double stddev = std::sqrt(sq / static_cast<double>(r.size()));
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(stddev, 0.1, 0.01);
  // x ~ N(0, 1).
  double x_sq = 0;
  for (float v : b.x) x_sq += v * v;
  EXPECT_NEAR(x_sq / static_cast<double>(b.x.size()), 1.0, 0.05);
}

TEST(SyntheticRegressionTest, FiniteDataSetWrapsAndShuffles) {
  DataConfig config = Synthetic();
  config.num_samples = 5;
  auto plain = MustCreate(config, kRegression);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->num_samples(), 5);
  const Batch epoch0 = Fetch(*plain, 0, 0, 1, 5);
  EXPECT_EQ(Fetch(*plain, 1, 0, 1, 5).x, epoch0.x);
  EXPECT_EQ(Fetch(*plain, 1, 0, 1, 5).y, epoch0.y);

  config.shuffle = true;
  auto shuffled = MustCreate(config, kRegression);
  ASSERT_TRUE(shuffled);
  // Each epoch holds the same 5 samples, rows intact (x with its own y).
  auto rows = [](const Batch& b) {
    std::vector<std::vector<float>> out;
    for (int r = 0; r < 5; ++r) {
      std::vector<float> row = Slice(b.x, r * 4, r * 4 + 4);
      const std::vector<float> y = Slice(b.y, r * 3, r * 3 + 3);
      row.insert(row.end(), y.begin(), y.end());
      out.push_back(row);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  for (int64_t step = 0; step < 3; ++step) {
    EXPECT_EQ(rows(Fetch(*shuffled, step, 0, 1, 5)), rows(epoch0));
  }
}

// --- tensors -----------------------------------------------------------------

// x[i] = [i, 100 + i], y[i] = [1000 + i] (f32), or y[i] = i % 3 (I32) with
// integer targets.
std::string WriteCountingTensors(const std::string& name, int64_t n,
                                 bool integer_y = false) {
  std::vector<float> x, y;
  std::vector<int32_t> yi;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(static_cast<float>(100 + i));
    y.push_back(static_cast<float>(1000 + i));
    yi.push_back(static_cast<int32_t>(i % 3));
  }
  const std::string path = TempPath(name);
  std::vector<TensorToWrite> tensors = {
      {"x", DType::kF32, {n, 2}, x.data(), x.size() * 4},
      integer_y
          ? TensorToWrite{"y", DType::kI32, {n}, yi.data(), yi.size() * 4}
          : TensorToWrite{"y", DType::kF32, {n, 1}, y.data(), y.size() * 4}};
  EXPECT_TRUE(WriteSafetensors(path, tensors).ok());
  return path;
}

DataConfig TensorsConfig(const std::string& path, bool shuffle = false,
                         uint64_t seed = 0) {
  DataConfig config;
  config.kind = DataConfig::Kind::kTensors;
  config.path = path;
  config.shuffle = shuffle;
  config.seed = seed;
  return config;
}

const SampleShapes kPairs = {.input = {2},
                             .token_input = false,
                             .target = {1},
                             .integer_targets = false};

// The sample indices a batch holds, read back from x[i][0] == i.
std::vector<int64_t> SampleIds(const Batch& b) {
  std::vector<int64_t> ids;
  for (size_t r = 0; r < b.x.size() / 2; ++r) {
    ids.push_back(static_cast<int64_t>(b.x[2 * r]));
    // Inputs and targets agree: the row's y belongs to the same sample.
    EXPECT_EQ(b.x[2 * r + 1], 100 + b.x[2 * r]);
    EXPECT_EQ(b.y[r], 1000 + b.x[2 * r]);
  }
  return ids;
}

TEST(TensorsTest, StepsTakeConsecutiveSamplesModuloN) {
  auto source = MustCreate(
      TensorsConfig(WriteCountingTensors("wrap.safetensors", 5)), kPairs);
  ASSERT_TRUE(source);
  EXPECT_EQ(source->num_samples(), 5);
  // Batch 4 of 5 samples: step s uses samples [4s, 4s + 4) mod 5.
  EXPECT_THAT(SampleIds(Fetch(*source, 0, 0, 1, 4)), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(SampleIds(Fetch(*source, 1, 0, 1, 4)), ElementsAre(4, 0, 1, 2));
  EXPECT_THAT(SampleIds(Fetch(*source, 2, 0, 1, 4)), ElementsAre(3, 4, 0, 1));
  // Microbatch j of 2 is the j-th contiguous half.
  EXPECT_THAT(SampleIds(Fetch(*source, 1, 0, 2, 4)), ElementsAre(4, 0));
  EXPECT_THAT(SampleIds(Fetch(*source, 1, 1, 2, 4)), ElementsAre(1, 2));
  // A batch larger than the data set repeats samples.
  EXPECT_THAT(SampleIds(Fetch(*source, 0, 0, 1, 7)),
              ElementsAre(0, 1, 2, 3, 4, 0, 1));
  const Batch b = Fetch(*source, 0, 0, 1, 4);
  EXPECT_THAT(b.input_shape, ElementsAre(4, 2));
  EXPECT_THAT(b.target_shape, ElementsAre(4, 1));
  for (int num_mb : {1, 2, 4}) ExpectSplitIndependent(*source, 7, 4, num_mb);
}

TEST(TensorsTest, ShuffleIsADeterministicPermutationPerEpoch) {
  const std::string path = WriteCountingTensors("shuffle.safetensors", 7);
  auto source = MustCreate(TensorsConfig(path, true, 9), kPairs);
  auto again = MustCreate(TensorsConfig(path, true, 9), kPairs);
  auto other_seed = MustCreate(TensorsConfig(path, true, 10), kPairs);
  ASSERT_TRUE(source && again && other_seed);

  std::vector<int64_t> identity(7);
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<std::vector<int64_t>> epochs;
  bool seeds_differ = false;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    // With batch N, step e is exactly epoch e.
    std::vector<int64_t> ids = SampleIds(Fetch(*source, epoch, 0, 1, 7));
    EXPECT_EQ(ids, SampleIds(Fetch(*again, epoch, 0, 1, 7)));
    seeds_differ |= ids != SampleIds(Fetch(*other_seed, epoch, 0, 1, 7));
    epochs.push_back(ids);
    std::sort(ids.begin(), ids.end());
    EXPECT_EQ(ids, identity) << "epoch " << epoch << " is not a permutation";
  }
  EXPECT_TRUE(seeds_differ);
  // Epochs are shuffled independently (4 equal orders of 7 would be a
  // 1-in-25-billion coincidence), and not left in file order.
  EXPECT_FALSE(epochs[0] == epochs[1] && epochs[1] == epochs[2] &&
               epochs[2] == epochs[3]);
  EXPECT_FALSE(std::all_of(epochs.begin(), epochs.end(),
                           [&](const auto& e) { return e == identity; }));

  // Position p is sample perm_{p / N}[p mod N] whatever the batch: fetch
  // positions 0..27 one at a time and in batches of 2 that straddle epochs.
  std::vector<int64_t> flat;
  for (const auto& e : epochs) flat.insert(flat.end(), e.begin(), e.end());
  for (int64_t p = 0; p < 28; ++p) {
    EXPECT_THAT(SampleIds(Fetch(*source, p, 0, 1, 1)), ElementsAre(flat[p]))
        << "position " << p;
  }
  for (int64_t step = 0; step < 14; ++step) {
    EXPECT_THAT(SampleIds(Fetch(*source, step, 1, 2, 2)),
                ElementsAre(flat[2 * step + 1]));
  }
  for (int num_mb : {1, 2, 3, 6}) ExpectSplitIndependent(*source, 1, 6, num_mb);
}

TEST(TensorsTest, ReadsOtherFloatDtypesAndIntegerTargets) {
  const std::vector<double> x = {0.5, -1.25, 2.0, 3.0, 4.5, -6.0};
  const std::vector<uint8_t> y = {2, 0, 1};
  const std::string path = TempPath("dtypes.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kF64, {3, 2}, x.data(), 48},
                                      {"y", DType::kU8, {3}, y.data(), 3}})
                  .ok());
  auto source = MustCreate(TensorsConfig(path), {.input = {2},
                                                 .token_input = false,
                                                 .target = {},
                                                 .integer_targets = true});
  ASSERT_TRUE(source);
  const Batch b = Fetch(*source, 0, 0, 1, 3);
  EXPECT_THAT(b.x, ElementsAre(0.5f, -1.25f, 2.0f, 3.0f, 4.5f, -6.0f));
  EXPECT_THAT(b.yi, ElementsAre(2, 0, 1));
  EXPECT_THAT(b.target_shape, ElementsAre(3));
}

TEST(TensorsTest, ReadsTokenInputsAsIntegers) {
  const std::vector<int32_t> x = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> y = {2, 3, 4, 5, 6, 7};
  const std::string path = TempPath("token_tensors.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kI32, {2, 3}, x.data(), 24},
                                      {"y", DType::kI64, {2, 3}, y.data(), 48}})
                  .ok());
  auto source = MustCreate(TensorsConfig(path), {.input = {3},
                                                 .token_input = true,
                                                 .target = {3},
                                                 .integer_targets = true});
  ASSERT_TRUE(source);
  const Batch b = Fetch(*source, 1, 0, 1, 1);
  EXPECT_THAT(b.xi, ElementsAre(4, 5, 6));
  EXPECT_THAT(b.yi, ElementsAre(5, 6, 7));
}

// --- tokens ------------------------------------------------------------------

DataConfig TokensConfig(const std::string& path, int64_t seq_len,
                        bool uint16 = false) {
  DataConfig config;
  config.kind = DataConfig::Kind::kTokens;
  config.path = path;
  config.seq_len = seq_len;
  config.token_dtype = uint16 ? TokenDType::kUint16 : TokenDType::kUint8;
  return config;
}

SampleShapes LanguageModel(int64_t seq_len) {
  return {.input = {seq_len},
          .token_input = true,
          .target = {seq_len},
          .integer_targets = true};
}

TEST(TokensTest, WindowsOverlapByOneTokenAndTargetsAreShifted) {
  const std::string path = TempPath("bytes.txt");
  WriteBytes(path, "abcdefghijk");  // 11 tokens.
  auto source = MustCreate(TokensConfig(path, 3), LanguageModel(3));
  ASSERT_TRUE(source);
  // Windows [abcd], [defg], [ghij]; 'k' is a tail too short for a window.
  EXPECT_EQ(source->num_samples(), 3);
  const Batch b = Fetch(*source, 0, 0, 1, 3);
  EXPECT_THAT(b.input_shape, ElementsAre(3, 3));
  EXPECT_THAT(b.target_shape, ElementsAre(3, 3));
  EXPECT_THAT(b.xi, ElementsAre('a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i'));
  EXPECT_THAT(b.yi, ElementsAre('b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'));
  // Step 1 with batch 2: positions 2, 3 -> windows 2, 0.
  const Batch wrapped = Fetch(*source, 1, 0, 1, 2);
  EXPECT_THAT(wrapped.xi, ElementsAre('g', 'h', 'i', 'a', 'b', 'c'));
  EXPECT_THAT(wrapped.yi, ElementsAre('h', 'i', 'j', 'b', 'c', 'd'));
  for (int num_mb : {1, 2, 4}) ExpectSplitIndependent(*source, 5, 4, num_mb);
}

TEST(TokensTest, SeqLenZeroTakesTheModelsInputLength) {
  const std::string path = TempPath("bytes_default.txt");
  WriteBytes(path, "0123456");
  auto source = MustCreate(TokensConfig(path, 0), LanguageModel(2));
  ASSERT_TRUE(source);
  EXPECT_EQ(source->num_samples(), 3);
  EXPECT_THAT(Fetch(*source, 2, 0, 1, 1).yi, ElementsAre('5', '6'));
}

TEST(TokensTest, ReadsLittleEndianUint16Tokens) {
  const std::string path = TempPath("tokens.u16");
  WriteBytes(path, Uint16File({1000, 2000, 65535, 3, 4, 258}));
  auto source = MustCreate(TokensConfig(path, 2, true), LanguageModel(2));
  ASSERT_TRUE(source);
  EXPECT_EQ(source->num_samples(), 2);  // (6 - 1) / 2.
  const Batch b = Fetch(*source, 0, 0, 1, 2);
  EXPECT_THAT(b.xi, ElementsAre(1000, 2000, 65535, 3));
  EXPECT_THAT(b.yi, ElementsAre(2000, 65535, 3, 4));
}

TEST(TokensTest, ShuffledWindowsAreDeterministicPermutations) {
  std::string text;
  for (int i = 0; i < 41; ++i) text.push_back(static_cast<char>(i));
  const std::string path = TempPath("shuffle_tokens.bin");
  WriteBytes(path, text);
  DataConfig config = TokensConfig(path, 4);
  config.shuffle = true;
  config.seed = 1;
  auto source = MustCreate(config, LanguageModel(4));
  auto again = MustCreate(config, LanguageModel(4));
  ASSERT_TRUE(source && again);
  ASSERT_EQ(source->num_samples(), 10);
  const Batch b = Fetch(*source, 0, 0, 1, 10);
  EXPECT_EQ(b.xi, Fetch(*again, 0, 0, 1, 10).xi);
  std::vector<int64_t> starts;
  for (int r = 0; r < 10; ++r) {
    starts.push_back(b.xi[4 * r]);
    for (int t = 0; t < 4; ++t) {
      // Contiguous windows; targets are inputs shifted by one.
      EXPECT_EQ(b.xi[4 * r + t], b.xi[4 * r] + t);
      EXPECT_EQ(b.yi[4 * r + t], b.xi[4 * r + t] + 1);
    }
  }
  std::vector<int64_t> sorted = starts;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_THAT(sorted, ElementsAre(0, 4, 8, 12, 16, 20, 24, 28, 32, 36));
  EXPECT_NE(starts, sorted);  // Shuffled: 1 in 3.6 million to be in order.
  for (int num_mb : {1, 2, 5}) ExpectSplitIndependent(*source, 3, 10, num_mb);
}

// --- errors ------------------------------------------------------------------

TEST(DataSourceErrorsTest, BatchArgumentsAreChecked) {
  auto source = MustCreate(Synthetic(), kRegression);
  ASSERT_TRUE(source);
  auto error = [&](int64_t step, int mb, int num_mb, int64_t batch) {
    absl::Status s = source->Inputs(Cpu(), step, mb, num_mb, batch).status();
    EXPECT_EQ(s, source->Targets(Cpu(), step, mb, num_mb, batch).status());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  EXPECT_THAT(
      error(0, 0, 3, 8),
      HasSubstr("batch_size 8 is not a multiple of num_microbatches 3"));
  EXPECT_THAT(error(0, 0, 1, 0), HasSubstr("batch_size must be positive"));
  EXPECT_THAT(error(0, 0, 0, 8),
              HasSubstr("num_microbatches must be positive"));
  EXPECT_THAT(error(0, 2, 2, 8), HasSubstr("microbatch 2 is outside [0, 2)"));
  EXPECT_THAT(error(0, -1, 2, 8), HasSubstr("microbatch -1"));
  EXPECT_THAT(error(-1, 0, 1, 8), HasSubstr("step must be non-negative"));
  EXPECT_THAT(error(INT64_MAX / 4, 0, 1, 8), HasSubstr("overflows"));
}

TEST(SyntheticRegressionTest, SequenceSamplesMapEveryPositionThroughWAndB) {
  // Inputs [3, 4] and targets [3, 2] per sample (a sequence model with MSE):
  // every position is y = x W + b with the same W and b.
  const SampleShapes shapes = {.input = {3, 4}, .target = {3, 2}};
  auto source = DataSource::Create(Synthetic(11, 0.0), shapes);
  ASSERT_TRUE(source.ok()) << source.status();
  Tensor x = *(*source)->Inputs(CpuBackend::Get(), 0, 0, 1, 2);
  Tensor y = *(*source)->Targets(CpuBackend::Get(), 0, 0, 1, 2);
  EXPECT_EQ(x.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(y.shape(), (Shape{2, 3, 2}));
  const SyntheticRegressionParams p = MakeSyntheticRegressionParams(11, 4, 2);
  for (int row = 0; row < 6; ++row) {
    for (int k = 0; k < 2; ++k) {
      double expect = p.bias[k];
      for (int i = 0; i < 4; ++i) {
        expect += x.data<float>()[row * 4 + i] * p.weight[i * 2 + k];
      }
      EXPECT_NEAR(y.data<float>()[row * 2 + k], expect, 1e-5);
    }
  }
}

TEST(DataSourceErrorsTest, SyntheticShapesAndFields) {
  SampleShapes shapes = kRegression;
  shapes.input = {2, 3};  // Leading dimensions differ from the target's.
  absl::Status s = CreateError(Synthetic(), shapes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("with the same leading dimensions"));
  EXPECT_THAT(s.message(), HasSubstr("[2, 3]"));

  shapes = kRegression;
  shapes.token_input = true;
  EXPECT_THAT(CreateError(Synthetic(), shapes).message(),
              HasSubstr("input is token ids [4]"));

  shapes = kRegression;
  shapes.integer_targets = true;
  EXPECT_THAT(CreateError(Synthetic(), shapes).message(),
              HasSubstr("its target integer ids"));

  EXPECT_THAT(CreateError(Synthetic(0, -1.0), kRegression).message(),
              HasSubstr("data.noise must be finite and non-negative, got -1"));

  DataConfig config = Synthetic();
  config.shuffle = true;
  EXPECT_THAT(CreateError(config, kRegression).message(),
              HasSubstr("data.shuffle needs a finite data set"));

  config = Synthetic();
  config.num_samples = -2;
  EXPECT_THAT(CreateError(config, kRegression).message(),
              HasSubstr("data.num_samples must be non-negative"));

  config = Synthetic();
  config.path = "/tmp/x";
  EXPECT_THAT(
      CreateError(config, kRegression).message(),
      HasSubstr(
          "data.path does not apply to data.source synthetic-regression"));

  config = Synthetic();
  config.seq_len = 4;
  EXPECT_THAT(CreateError(config, kRegression).message(),
              HasSubstr("data.seq_len does not apply"));
}

TEST(DataSourceErrorsTest, TensorsFileProblems) {
  absl::Status s = CreateError(TensorsConfig(""), kPairs);
  EXPECT_THAT(s.message(), HasSubstr("data.path is required"));

  s = CreateError(TensorsConfig(TempPath("missing.safetensors")), kPairs);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("missing.safetensors"));

  const float v[6] = {1, 2, 3, 4, 5, 6};
  const std::string only_x = TempPath("only_x.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(only_x, {{"x", DType::kF32, {3, 2}, v, 24}}).ok());
  s = CreateError(TensorsConfig(only_x), kPairs);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no tensor 'y'"));

  const std::string path = WriteCountingTensors("errors.safetensors", 3);
  SampleShapes shapes = kPairs;
  shapes.input = {3};
  s = CreateError(TensorsConfig(path), shapes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'x' has shape [3, 2], but the "
                                     "model's inputs need [N, 3]"));

  shapes = kPairs;
  shapes.target = {2};
  EXPECT_THAT(CreateError(TensorsConfig(path), shapes).message(),
              HasSubstr("tensor 'y' has shape [3, 1], but the model's "
                        "targets need [N, 2]"));

  shapes = kPairs;
  shapes.token_input = true;
  EXPECT_THAT(CreateError(TensorsConfig(path), shapes).message(),
              HasSubstr("tensor 'x' has dtype F32, but the model's inputs "
                        "are integer ids"));

  shapes = kPairs;
  shapes.integer_targets = true;
  EXPECT_THAT(CreateError(TensorsConfig(path), shapes).message(),
              HasSubstr("tensor 'y' has dtype F32, but the model's targets "
                        "are integer ids"));

  const std::string mismatch = TempPath("mismatch.safetensors");
  ASSERT_TRUE(WriteSafetensors(mismatch, {{"x", DType::kF32, {3, 2}, v, 24},
                                          {"y", DType::kF32, {2, 1}, v, 8}})
                  .ok());
  EXPECT_THAT(CreateError(TensorsConfig(mismatch), kPairs).message(),
              HasSubstr("'x' has 3 samples but 'y' has 2"));

  const std::string empty = TempPath("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(empty, {{"x", DType::kF32, {0, 2}, v, 0},
                                       {"y", DType::kF32, {0, 1}, v, 0}})
                  .ok());
  EXPECT_THAT(CreateError(TensorsConfig(empty), kPairs).message(),
              HasSubstr("hold no samples"));

  DataConfig config = TensorsConfig(path);
  config.vocab_size = 10;
  EXPECT_THAT(
      CreateError(config, kPairs).message(),
      HasSubstr("data.vocab_size does not apply to data.source tensors"));
  config = TensorsConfig(path);
  config.num_samples = 10;
  EXPECT_THAT(CreateError(config, kPairs).message(),
              HasSubstr("data.num_samples does not apply"));
}

TEST(DataSourceErrorsTest, TokensFileProblems) {
  const std::string short_file = TempPath("short.txt");
  WriteBytes(short_file, "abcd");
  absl::Status s = CreateError(TokensConfig(short_file, 4), LanguageModel(4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("4 tokens are too few for one window of "
                                     "seq_len + 1 = 5 tokens"));
  // Exactly one window is enough.
  EXPECT_TRUE(
      DataSource::Create(TokensConfig(short_file, 3), LanguageModel(3)).ok());

  const std::string text = TempPath("vocab.txt");
  WriteBytes(text, "aaaaz");
  DataConfig config = TokensConfig(text, 2);
  config.vocab_size = 'z';
  s = CreateError(config, LanguageModel(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("vocab.txt: the token at byte offset 4 "
                                     "is 122, not below data.vocab_size 122"));
  config.vocab_size = 'z' + 1;
  EXPECT_TRUE(DataSource::Create(config, LanguageModel(2)).ok());
  // The model's vocabulary bounds both: data.vocab_size above it is
  // refused, and without one the ids are checked against it.
  SampleShapes small_vocab = LanguageModel(2);
  small_vocab.vocab = 'z';
  EXPECT_THAT(CreateError(config, small_vocab).message(),
              HasSubstr("data.vocab_size is 123 but the model's vocabulary "
                        "is 122"));
  EXPECT_THAT(CreateError(TokensConfig(text, 2), small_vocab).message(),
              HasSubstr("byte offset 4 is 122, not below the model's "
                        "vocabulary 122"));
  small_vocab.vocab = 'z' + 1;
  EXPECT_TRUE(DataSource::Create(TokensConfig(text, 2), small_vocab).ok());

  const std::string odd = TempPath("odd.u16");
  WriteBytes(odd, "abcde");
  EXPECT_THAT(
      CreateError(TokensConfig(odd, 1, true), LanguageModel(1)).message(),
      HasSubstr("5 bytes is not a whole number of uint16 tokens"));

  EXPECT_THAT(CreateError(TokensConfig(text, 3), LanguageModel(2)).message(),
              HasSubstr("data.seq_len is 3 but the model's input_shape[0] "
                        "is 2"));
  EXPECT_THAT(CreateError(TokensConfig(text, -1), LanguageModel(2)).message(),
              HasSubstr("data.seq_len must be positive"));

  SampleShapes floats = LanguageModel(2);
  floats.token_input = false;
  EXPECT_THAT(CreateError(TokensConfig(text, 2), floats).message(),
              HasSubstr("needs a model with token-id input"));
  SampleShapes mse = LanguageModel(2);
  mse.integer_targets = false;
  EXPECT_THAT(CreateError(TokensConfig(text, 2), mse).message(),
              HasSubstr("model's target is floats [2]"));
  SampleShapes wrong_target = LanguageModel(2);
  wrong_target.target = {3};
  EXPECT_THAT(CreateError(TokensConfig(text, 2), wrong_target).message(),
              HasSubstr("integer targets [2]"));

  EXPECT_THAT(CreateError(TokensConfig("", 2), LanguageModel(2)).message(),
              HasSubstr("data.path is required for data.source tokens"));
  EXPECT_EQ(CreateError(TokensConfig(TempPath("nope.bin"), 2), LanguageModel(2))
                .code(),
            absl::StatusCode::kNotFound);
  config = TokensConfig(text, 2);
  config.vocab_size = -5;
  EXPECT_THAT(CreateError(config, LanguageModel(2)).message(),
              HasSubstr("data.vocab_size must be positive"));
}

}  // namespace
}  // namespace conveyor::engine
