// The token data sources (engine/data.h): tokens files of every dtype, llm.c
// shards of both magics, Megatron data sets of every integer dtype and their
// blends, hostile files, and a data set far larger than what it costs in
// memory. Expected ids are written out by hand from the files' contents.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/data.h"
#include "engine/internal/data_blend.h"
#include "engine/megatron_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/data_test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace data_testing;  // NOLINT: the helpers of this test family.
using Kind = DataConfig::Kind;

absl::Status CreateError(const DataConfig& config, const SampleShapes& shapes) {
  absl::StatusOr<std::unique_ptr<DataSource>> source =
      DataSource::Create(config, shapes);
  EXPECT_FALSE(source.ok());
  return source.status();
}

// Overwrites bytes of a file in place, as a hostile edit would.
void Patch(const std::string& path, uint64_t offset, const std::string& bytes) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good());
}

// --- tokens ------------------------------------------------------------------

TEST(TokensDTypeTest, Uint32HoldsLlama3Ids) {
  const std::string path = TempPath("ids.u32");
  WriteBytes(path, LittleEndian({70000, 1, 128255, 5, 9}, 4));
  DataConfig config = TokenConfig(Kind::kTokens, path, 2);
  config.token_dtype = TokenDType::kUint32;
  auto source = MustCreate(config, LanguageModel(2, 128256));
  ASSERT_TRUE(source);
  EXPECT_EQ(source->num_samples(), 2);  // (5 - 1) / 2.
  EXPECT_THAT(Inputs(*source, 0, 2), ElementsAre(70000, 1, 128255, 5));
  EXPECT_THAT(Targets(*source, 0, 2), ElementsAre(1, 128255, 5, 9));
}

TEST(TokensDTypeTest, Int32RefusesNegativeIdsWithTheirOffset) {
  const std::string path = TempPath("ids.i32");
  WriteBytes(path, LittleEndian({3, 2147483647, 4, 1}, 4));
  DataConfig config = TokenConfig(Kind::kTokens, path, 2);
  config.token_dtype = TokenDType::kInt32;
  auto source = MustCreate(config, LanguageModel(2));
  ASSERT_TRUE(source);
  EXPECT_THAT(Inputs(*source, 0, 1), ElementsAre(3, 2147483647));

  WriteBytes(path, LittleEndian({3, 2, -1, 4}, 4));
  absl::Status s = CreateError(config, LanguageModel(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("ids.i32: the token at byte offset 8 is -1, a "
                        "negative id"));
  // The same bytes as uint32 are 4294967295, above the model's vocabulary.
  config.token_dtype = TokenDType::kUint32;
  EXPECT_THAT(CreateError(config, LanguageModel(2, 50000)).message(),
              HasSubstr("byte offset 8 is 4294967295, not below the model's "
                        "vocabulary 50000"));
}

TEST(TokensDTypeTest, SizesThatAreNotWholeTokensAreRefused) {
  const std::string path = TempPath("ragged.u32");
  WriteBytes(path, std::string(10, '\0'));
  DataConfig config = TokenConfig(Kind::kTokens, path, 1);
  config.token_dtype = TokenDType::kUint32;
  EXPECT_THAT(CreateError(config, LanguageModel(1)).message(),
              HasSubstr("10 bytes is not a whole number of uint32 tokens"));
}

TEST(TokensDTypeTest, DirectoriesFifosAndEmptyFilesAreRefused) {
  const std::string dir = TempPath("a_directory");
  std::filesystem::create_directories(dir);
  absl::Status s =
      CreateError(TokenConfig(Kind::kTokens, dir, 2), LanguageModel(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("a_directory: not a regular file"));

  const std::string fifo = TempPath("a_fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (Kind kind : {Kind::kTokens, Kind::kLlmc}) {
    EXPECT_THAT(
        CreateError(TokenConfig(kind, fifo, 2), LanguageModel(2)).message(),
        HasSubstr("a_fifo: not a regular file"));
  }

  const std::string empty = TempPath("empty.bin");
  WriteBytes(empty, "");
  EXPECT_THAT(
      CreateError(TokenConfig(Kind::kTokens, empty, 2), LanguageModel(2))
          .message(),
      HasSubstr("empty.bin: empty file"));
}

TEST(TokensDTypeTest, AFileThatShrinksAfterCreateFailsTheGather) {
  const std::string path = TempPath("shrinks.bin");
  WriteBytes(path, std::string(1000, 'a'));
  auto source =
      MustCreate(TokenConfig(Kind::kTokens, path, 4), LanguageModel(4));
  ASSERT_TRUE(source);
  ASSERT_EQ(::truncate(path.c_str(), 10), 0);
  absl::StatusOr<Tensor> t = source->Inputs(CpuBackend::Get(), 0, 0, 1, 2);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(t.status().message(), HasSubstr("shrank from 1000 to 10 bytes"));
}

// --- llmc --------------------------------------------------------------------

TEST(LlmcTest, ReadsBothMagics) {
  const std::string gpt2 = TempPath("gpt2.bin");
  WriteBytes(gpt2, LlmcShard(20240520, {1, 2, 3, 65535, 7}));
  auto source = MustCreate(TokenConfig(Kind::kLlmc, gpt2, 2), LanguageModel(2));
  ASSERT_TRUE(source);
  EXPECT_EQ(source->num_samples(), 2);
  EXPECT_THAT(Inputs(*source, 0, 2), ElementsAre(1, 2, 3, 65535));
  EXPECT_THAT(Targets(*source, 0, 2), ElementsAre(2, 3, 65535, 7));

  const std::string llama3 = TempPath("llama3.bin");
  WriteBytes(llama3, LlmcShard(20240801, {100000, 2, 128000, 4, 5}));
  source = MustCreate(TokenConfig(Kind::kLlmc, llama3, 2), LanguageModel(2));
  ASSERT_TRUE(source);
  EXPECT_THAT(Inputs(*source, 1, 1), ElementsAre(128000, 4));
  EXPECT_THAT(Targets(*source, 1, 1), ElementsAre(4, 5));
  // An id above the model's vocabulary, named with its byte offset: the
  // header's 1024 bytes, then 4 bytes per token.
  EXPECT_THAT(
      CreateError(TokenConfig(Kind::kLlmc, llama3, 2), LanguageModel(2, 128000))
          .message(),
      HasSubstr("llama3.bin: the token at byte offset 1032 is 128000, not "
                "below the model's vocabulary 128000"));
}

TEST(LlmcTest, RefusesBadHeaders) {
  const std::string path = TempPath("bad_llmc.bin");
  auto error = [&](const std::string& bytes) {
    WriteBytes(path, bytes);
    absl::Status s =
        CreateError(TokenConfig(Kind::kLlmc, path, 2), LanguageModel(2));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  EXPECT_THAT(error(LlmcShard(12345, {1, 2, 3})),
              HasSubstr("magic 12345 at byte 0 is not an llm.c token shard's "
                        "(20240520 for uint16 tokens, 20240801 for uint32"));
  EXPECT_THAT(error(LlmcShard(20240520, {1, 2, 3}, /*version=*/2)),
              HasSubstr("version 2 at byte 4"));
  EXPECT_THAT(
      error(LlmcShard(20240520, {1, 2, 3, 4, 5}, 1, /*count=*/10)),
      HasSubstr("the header (byte 8) says 10 uint16 tokens, 1044 bytes with "
                "the header, but the file has 1034: it is truncated"));
  EXPECT_THAT(error(LlmcShard(20240801, {1, 2, 3, 4, 5}, 1, /*count=*/3)),
              HasSubstr("says 3 uint32 tokens, 1036 bytes with the header, "
                        "but the file has 1044"));
  EXPECT_THAT(error(LlmcShard(20240520, {}, 1, 0)),
              HasSubstr("token count at byte 8 is 0"));
  EXPECT_THAT(error(std::string(100, '\0')),
              HasSubstr("100 bytes is too short for an llm.c header"));
  EXPECT_THAT(error(LlmcShard(20240520, {1, 2})),
              HasSubstr("2 tokens are too few for one window"));
}

// --- megatron ----------------------------------------------------------------

TEST(MegatronSourceTest, EveryIntegerDTypeCodeReadsTheDocumentsInOrder) {
  for (int code : {1, 2, 3, 4, 5, 8}) {
    const MegatronDType dtype = *MegatronDTypeFromCode(code);
    const std::string prefix =
        TempPath(absl::StrCat("mg_", MegatronDTypeName(dtype)));
    WriteMegatron(prefix, dtype, {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}});
    auto source =
        MustCreate(TokenConfig(Kind::kMegatron, prefix, 3), LanguageModel(3));
    ASSERT_TRUE(source);
    // The stream 1..9 in windows [1 2 3 4], [4 5 6 7]; the tail 8 9 unused.
    EXPECT_EQ(source->num_samples(), 2) << MegatronDTypeName(dtype);
    EXPECT_THAT(Inputs(*source, 0, 2), ElementsAre(1, 2, 3, 4, 5, 6));
    EXPECT_THAT(Targets(*source, 0, 2), ElementsAre(2, 3, 4, 5, 6, 7));
  }
}

TEST(MegatronSourceTest, SignedAndWideIdsMustFitTheVocabulary) {
  // int8: a byte 0xff is -1.
  const std::string int8 = TempPath("mg_neg");
  WriteMegatron(int8, MegatronDType::kInt8, {{1, 2, 3, 4}});
  Patch(int8 + ".bin", 2, "\xff");
  EXPECT_THAT(
      CreateError(TokenConfig(Kind::kMegatron, int8, 2), LanguageModel(2))
          .message(),
      HasSubstr("mg_neg.bin: the token at byte offset 2 is -1, a "
                "negative id"));
  // int64: accepted while the ids fit.
  const std::string int64 = TempPath("mg_wide");
  WriteMegatron(int64, MegatronDType::kInt64, {{1, 2, int64_t{1} << 40}});
  EXPECT_THAT(CreateError(TokenConfig(Kind::kMegatron, int64, 2),
                          LanguageModel(2, 1000))
                  .message(),
              HasSubstr("mg_wide.bin: the token at byte offset 16 is "
                        "1099511627776, not below the model's vocabulary "
                        "1000"));
}

TEST(MegatronSourceTest, HostileFilesAreRefusedAtCreate) {
  const std::string prefix = TempPath("mg_hostile");
  auto error = [&]() {
    absl::Status s =
        CreateError(TokenConfig(Kind::kMegatron, prefix, 2), LanguageModel(2));
    return std::string(s.message());
  };
  auto fresh = [&]() {
    WriteMegatron(prefix, MegatronDType::kUint16, {{1, 2, 3}, {4, 5}});
  };
  fresh();
  ASSERT_TRUE(
      MustCreate(TokenConfig(Kind::kMegatron, prefix, 2), LanguageModel(2)));
  // A truncated .bin.
  ASSERT_EQ(::truncate((prefix + ".bin").c_str(), 8), 0);
  EXPECT_THAT(error(), HasSubstr("sequence 1 (2 tokens from byte 6) runs past "
                                 "the end of " +
                                 prefix + ".bin (8 bytes)"));
  // Pointers past the .bin: sequence 1 claims to start at byte 4096.
  fresh();
  Patch(prefix + ".idx", 34 + 8 + 8, LittleEndian({4096}, 8));
  EXPECT_THAT(error(), HasSubstr("sequence 1 starts at byte 4096 of " + prefix +
                                 ".bin (pointer at byte 50)"));
  // Wrong magic, unknown and float dtype codes.
  fresh();
  Patch(prefix + ".idx", 0, "NOTMEGA");
  EXPECT_THAT(error(), HasSubstr("not a Megatron index"));
  for (const auto& [code, message] : std::vector<std::pair<int, std::string>>{
           {0, "unknown Megatron dtype code 0"},
           {99, "unknown Megatron dtype code 99"},
           {6, "dtype code 6 (float64) at byte 17 is not an integer type"},
           {7, "dtype code 7 (float32) at byte 17 is not an integer type"}}) {
    fresh();
    Patch(prefix + ".idx", 17, std::string(1, static_cast<char>(code)));
    EXPECT_THAT(error(), HasSubstr(message)) << code;
  }
  // A missing .idx, and a directory or FIFO where a file should be.
  fresh();
  std::filesystem::remove(prefix + ".idx");
  EXPECT_THAT(error(), HasSubstr(prefix + ".idx: open"));
  ASSERT_EQ(::mkfifo((prefix + ".idx").c_str(), 0600), 0);
  EXPECT_THAT(error(), HasSubstr(".idx: not a regular file"));
  std::filesystem::remove(prefix + ".idx");
  std::filesystem::remove(prefix + ".bin");
  std::filesystem::create_directories(prefix + ".bin");
  EXPECT_THAT(error(), HasSubstr(".bin: not a regular file"));
  std::filesystem::remove(prefix + ".bin");
}

TEST(MegatronSourceTest, PathAndBlendAreExclusive) {
  DataConfig config = TokenConfig(Kind::kMegatron, "", 2);
  EXPECT_THAT(CreateError(config, LanguageModel(2)).message(),
              HasSubstr("exactly one of data.path"));
  config.path = "x";
  config.blend = {{"a", 1}, {"b", 1}};
  EXPECT_THAT(CreateError(config, LanguageModel(2)).message(),
              HasSubstr("exactly one of data.path"));
  DataConfig tokens = TokenConfig(Kind::kTokens, "x", 2);
  tokens.blend = {{"a", 1}, {"b", 1}};
  EXPECT_THAT(CreateError(tokens, LanguageModel(2)).message(),
              HasSubstr("data.blend does not apply to data.source tokens"));
}

// --- blends ------------------------------------------------------------------

using data_internal::BlendSchedule;

std::vector<std::pair<int, int64_t>> FirstSamples(const BlendSchedule& b,
                                                  int n) {
  std::vector<std::pair<int, int64_t>> out;
  for (int i = 0; i < n; ++i) out.push_back(b.Locate(i));
  return out;
}

TEST(BlendScheduleTest, FollowsMegatronsGreedyRule) {
  // Weights 1 : 3. Deficits a_k (i + 1) - 4 c_k: i = 0: (1, 3) -> B;
  // i = 1: (2, 2), a tie -> A; i = 2: (-1, 5) -> B; i = 3: (0, 4) -> B;
  // then the period of 4 repeats.
  absl::StatusOr<BlendSchedule> b = BlendSchedule::Create({1, 3});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->period(), 4);
  EXPECT_THAT(b->parts(), ElementsAre(1, 3));
  using P = std::pair<int, int64_t>;
  EXPECT_THAT(FirstSamples(*b, 8),
              ElementsAre(P{1, 0}, P{0, 0}, P{1, 1}, P{1, 2}, P{1, 3}, P{0, 1},
                          P{1, 4}, P{1, 5}));
  // Far out, the same: period 250000 starts at sample 10^6.
  EXPECT_EQ(b->Locate(1000000), (P{1, 750000}));
  EXPECT_EQ(b->Locate(1000001), (P{0, 250000}));
}

TEST(BlendScheduleTest, ProportionsAreExactPerPeriodAndWithinOneSample) {
  // 0.3 and 0.7 are exactly 3 : 7.
  absl::StatusOr<BlendSchedule> b = BlendSchedule::Create({0.3, 0.7});
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(b->parts(), ElementsAre(3, 7));
  EXPECT_EQ(b->period(), 10);
  int64_t taken[2] = {0, 0};
  for (int64_t n = 1; n <= 1000; ++n) {
    const auto [k, draw] = b->Locate(n - 1);
    EXPECT_EQ(draw, taken[k]);  // Each data set's draws count up by one.
    ++taken[k];
    // Never more than one sample from the ideal 0.3 n.
    EXPECT_LT(std::abs(static_cast<double>(taken[0]) - 0.3 * n), 1.0) << n;
    if (n % 10 == 0) {
      EXPECT_EQ(taken[0], 3 * n / 10);
    }
  }
  // Weights with no short decimal form are rounded to parts of 2^20.
  absl::StatusOr<BlendSchedule> pi = BlendSchedule::Create({1, M_PI});
  ASSERT_TRUE(pi.ok());
  EXPECT_NEAR(static_cast<double>(pi->parts()[1]) / pi->parts()[0], M_PI, 1e-5);
  // Equal integer weights reduce to 1 : 1, alternating.
  absl::StatusOr<BlendSchedule> even = BlendSchedule::Create({5, 5});
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(even->period(), 2);
}

TEST(BlendScheduleTest, RefusesBadWeights) {
  EXPECT_THAT(BlendSchedule::Create({1}).status().message(),
              HasSubstr("got 1 (give one as data.path)"));
  EXPECT_THAT(BlendSchedule::Create({1, 0}).status().message(),
              HasSubstr("data.blend[1].weight must be a finite positive"));
  EXPECT_THAT(BlendSchedule::Create({-1, 2}).status().message(),
              HasSubstr("data.blend[0].weight"));
  EXPECT_THAT(BlendSchedule::Create({1, NAN}).status().message(),
              HasSubstr("data.blend[1].weight"));
}

DataConfig BlendConfig(int64_t seq_len) {
  DataConfig config;
  config.kind = Kind::kMegatron;
  config.seq_len = seq_len;
  config.blend = {{TempPath("blend_a"), 1}, {TempPath("blend_b"), 3}};
  return config;
}

void WriteBlendSets() {
  // A: tokens 0..8, windows of seq_len 2 start at 0, 2, 4, 6.
  WriteMegatron(TempPath("blend_a"), MegatronDType::kUint16,
                {{0, 1, 2, 3}, {4, 5, 6, 7, 8}});
  // B: tokens 100..108 as int32, windows start at 100, 102, 104, 106.
  WriteMegatron(TempPath("blend_b"), MegatronDType::kInt32,
                {{100, 101, 102, 103, 104, 105, 106, 107, 108}});
}

std::vector<int64_t> RowStarts(const std::vector<int64_t>& ids, int64_t len) {
  std::vector<int64_t> starts;
  for (size_t i = 0; i < ids.size(); i += len) starts.push_back(ids[i]);
  return starts;
}

TEST(MegatronBlendTest, SamplesFollowTheScheduleAndEachDataSetsWindows) {
  WriteBlendSets();
  auto source = MustCreate(BlendConfig(2), LanguageModel(2));
  ASSERT_TRUE(source);
  EXPECT_EQ(source->num_samples(), 0);  // A blend has no epoch.
  // Schedule B A B B | B A B B: B's draws 0..5 are its windows 0, 1, 2, 3,
  // 0, 1; A's draws 0, 1 its windows 0, 1.
  const std::vector<int64_t> ids = Inputs(*source, 0, 8);
  EXPECT_THAT(RowStarts(ids, 2),
              ElementsAre(100, 0, 102, 104, 106, 2, 100, 102));
  EXPECT_THAT(RowStarts(Targets(*source, 0, 8), 2),
              ElementsAre(101, 1, 103, 105, 107, 3, 101, 103));
  // Split into microbatches, the same samples.
  std::vector<int64_t> split;
  for (int mb = 0; mb < 4; ++mb) {
    absl::StatusOr<Tensor> t = source->Inputs(CpuBackend::Get(), 0, mb, 4, 8);
    ASSERT_TRUE(t.ok());
    for (int64_t v : ToI64(*t)) split.push_back(v);
  }
  EXPECT_EQ(split, ids);
}

TEST(MegatronBlendTest, ShuffledBlendsArePureFunctionsOfTheConfig) {
  WriteBlendSets();
  DataConfig config = BlendConfig(2);
  config.shuffle = true;
  config.seed = 7;
  auto source = MustCreate(config, LanguageModel(2));
  auto again = MustCreate(config, LanguageModel(2));
  ASSERT_TRUE(source && again);
  const std::vector<int64_t> starts = RowStarts(Inputs(*source, 0, 16), 2);
  EXPECT_EQ(starts, RowStarts(Inputs(*again, 0, 16), 2));
  // Which data set each sample comes from does not depend on shuffle; B's
  // first four draws are a permutation of its four windows.
  std::vector<int64_t> b_first;
  for (size_t i = 0; i < starts.size(); ++i) {
    EXPECT_EQ(starts[i] >= 100, i % 4 != 1) << i;
    if (starts[i] >= 100 && b_first.size() < 4) b_first.push_back(starts[i]);
  }
  std::sort(b_first.begin(), b_first.end());
  EXPECT_THAT(b_first, ElementsAre(100, 102, 104, 106));
  // Errors of one data set name its place in the blend.
  config.blend[1].path = TempPath("blend_missing");
  EXPECT_THAT(CreateError(config, LanguageModel(2)).message(),
              HasSubstr("data.blend[1]: "));
}

// --- a data set larger than what it costs ------------------------------------

int64_t ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// A sparse file of `bytes` zeros; false if the filesystem refuses one.
bool MakeSparseFile(const std::string& path, int64_t bytes) {
  { std::ofstream create(path, std::ios::binary | std::ios::trunc); }
  return ::truncate(path.c_str(), bytes) == 0;
}

TEST(LargeTokenFileTest, GathersAcrossAFewGigabytesWithFlatMemory) {
  const std::string path = TempPath("sparse.u16");
  constexpr int64_t kBytes = int64_t{3} << 30;  // 3 GiB of uint16 zeros.
  if (!MakeSparseFile(path, kBytes)) {
    GTEST_SKIP() << "the filesystem refuses a sparse 3 GiB file";
  }
  // One bad id near the end: larger files are checked window by window, so
  // Create succeeds and the window holding it fails.
  constexpr int64_t kSeqLen = 1024;
  const int64_t tokens = kBytes / 2;
  const int64_t windows = (tokens - 1) / kSeqLen;
  const int64_t bad_window = windows - 3;
  const uint64_t bad_offset =
      static_cast<uint64_t>(bad_window * kSeqLen + 5) * 2;
  Patch(path, bad_offset, LittleEndian({60000}, 2));

  const int64_t before = ResidentKiB();
  ASSERT_GT(before, 0);
  DataConfig config = TokenConfig(Kind::kTokens, path, kSeqLen);
  config.token_dtype = TokenDType::kUint16;
  auto source = MustCreate(config, LanguageModel(kSeqLen, 50257));
  ASSERT_TRUE(source);
  EXPECT_EQ(source->num_samples(), windows);
  // 64 batches of 16 windows spread over the whole file.
  constexpr int64_t kBatch = 16;
  const int64_t stride = windows / kBatch / 64;
  for (int64_t j = 0; j < 64; ++j) {
    const std::vector<int64_t> ids = Inputs(*source, j * stride, kBatch);
    ASSERT_EQ(ids.size(), static_cast<size_t>(kBatch * kSeqLen));
    EXPECT_EQ(ids.front(), 0);
    EXPECT_EQ(ids.back(), 0);
  }
  const int64_t after = ResidentKiB();
  // What was touched is about 1024 windows of 2 KiB; far below the 3 GiB
  // that reading the file into memory would cost.
  EXPECT_LT(after - before, 64 * 1024)
      << "RSS grew by " << after - before << " KiB for a 3 GiB file";
  absl::StatusOr<Tensor> bad =
      source->Inputs(CpuBackend::Get(), bad_window, 0, 1, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr(absl::StrCat("sparse.u16: the token at byte offset ",
                                     bad_offset,
                                     " is 60000, not below the model's "
                                     "vocabulary 50257")));
  std::filesystem::remove(path);
}

TEST(LargeTokenFileTest, ReadingFarMoreThanTheReleasePeriodStaysBounded) {
  const std::string path = TempPath("sparse_long.u16");
  constexpr int64_t kBytes = int64_t{3} << 30;
  if (!MakeSparseFile(path, kBytes)) {
    GTEST_SKIP() << "the filesystem refuses a sparse 3 GiB file";
  }
  // Windows of 128 KiB; 2048 of them spread over the file are 256 MiB of
  // pages, which would all stay mapped without the periodic release (every
  // 64 MiB read).
  constexpr int64_t kSeqLen = 65536;
  DataConfig config = TokenConfig(Kind::kTokens, path, kSeqLen);
  config.token_dtype = TokenDType::kUint16;
  auto source = MustCreate(config, LanguageModel(kSeqLen));
  ASSERT_TRUE(source);
  const int64_t windows = source->num_samples();
  constexpr int64_t kBatch = 16;
  const int64_t steps = 128;
  const int64_t stride = windows / kBatch / steps;
  ASSERT_GE(stride, 1);
  const int64_t before = ResidentKiB();
  for (int64_t j = 0; j < steps; ++j) {
    absl::StatusOr<Tensor> t =
        source->Inputs(CpuBackend::Get(), j * stride, 0, 1, kBatch);
    ASSERT_TRUE(t.ok()) << t.status();
  }
  const int64_t after = ResidentKiB();
  EXPECT_LT(after - before, 128 * 1024)
      << "RSS grew by " << after - before << " KiB after reading 256 MiB";
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace conveyor::engine
