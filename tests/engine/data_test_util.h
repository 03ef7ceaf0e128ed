// Helpers the token data source tests share: files of little-endian ids,
// llm.c shards, Megatron data sets, and reading a microbatch back as host
// vectors.
#ifndef CONVEYOR_TESTS_ENGINE_DATA_TEST_UTIL_H_
#define CONVEYOR_TESTS_ENGINE_DATA_TEST_UTIL_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/little_endian.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/data.h"
#include "engine/megatron_writer.h"
#include "gtest/gtest.h"

namespace conveyor::engine::data_testing {

inline std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/data_tokens_test_" + name;
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

// `ids` as little-endian integers of `bytes` bytes each (two's complement
// for negative ones).
inline std::string LittleEndian(const std::vector<int64_t>& ids, int bytes) {
  std::string out;
  for (int64_t id : ids) {
    const auto v = static_cast<uint64_t>(id);
    for (int b = 0; b < bytes; ++b) {
      out.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
    }
  }
  return out;
}

// An llm.c shard: 256 int32 header (magic, version, count) then the ids.
inline std::string LlmcShard(int32_t magic, const std::vector<int64_t>& ids,
                             int32_t version = 1, int64_t count = -1) {
  std::vector<int64_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count >= 0 ? count : static_cast<int64_t>(ids.size());
  return LittleEndian(header, 4) + LittleEndian(ids, magic == 20240520 ? 2 : 4);
}

inline void WriteMegatron(const std::string& prefix, MegatronDType dtype,
                          const std::vector<std::vector<int64_t>>& documents) {
  auto writer = MegatronWriter::Create(prefix, dtype);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const auto& d : documents) {
    ASSERT_TRUE((*writer)->AddDocument(d).ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

inline SampleShapes LanguageModel(int64_t seq_len, int64_t vocab = 0) {
  return {.input = {seq_len},
          .token_input = true,
          .target = {seq_len},
          .integer_targets = true,
          .vocab = vocab};
}

inline DataConfig TokenConfig(DataConfig::Kind kind, const std::string& path,
                              int64_t seq_len) {
  DataConfig config;
  config.kind = kind;
  config.path = path;
  config.seq_len = seq_len;
  return config;
}

// The source `config` makes for `shapes`, failing the test (and returning
// null) when Create refuses.
inline std::unique_ptr<DataSource> MustCreate(const DataConfig& config,
                                              const SampleShapes& shapes) {
  absl::StatusOr<std::unique_ptr<DataSource>> source =
      DataSource::Create(config, shapes);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *std::move(source) : nullptr;
}

inline std::vector<int64_t> ToI64(const Tensor& t) {
  std::vector<int64_t> v(t.numel());
  EXPECT_EQ(t.dtype(), DType::kI64);
  EXPECT_TRUE(CpuBackend::Get()->CopyToHost(t, v.data(), v.size() * 8).ok());
  return v;
}

// The inputs (or targets) of microbatch 0 of 1 of `step` with `batch`.
inline std::vector<int64_t> Inputs(DataSource& source, int64_t step,
                                   int64_t batch) {
  absl::StatusOr<Tensor> t =
      source.Inputs(CpuBackend::Get(), step, 0, 1, batch);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? ToI64(*t) : std::vector<int64_t>{};
}
inline std::vector<int64_t> Targets(DataSource& source, int64_t step,
                                    int64_t batch) {
  absl::StatusOr<Tensor> t =
      source.Targets(CpuBackend::Get(), step, 0, 1, batch);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? ToI64(*t) : std::vector<int64_t>{};
}

}  // namespace conveyor::engine::data_testing

#endif  // CONVEYOR_TESTS_ENGINE_DATA_TEST_UTIL_H_
