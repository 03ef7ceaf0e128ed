// The Megatron format helpers, writer and index reader: round trips of
// every integer dtype, byte layouts checked by hand, and hostile indexes.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/little_endian.h"
#include "engine/megatron_format.h"
#include "engine/megatron_index.h"
#include "engine/megatron_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPrefix(const std::string& name) {
  return ::testing::TempDir() + "/megatron_test_" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

template <typename T>
void Put(std::string& out, T value) {
  char le[sizeof(T)];
  StoreLittleEndian(le, value);
  out.append(le, sizeof(T));
}

// An index as Megatron lays it out, from its fields (no checks, so tests
// can write hostile ones).
struct IdxFields {
  std::string magic = std::string("MMIDIDX\0\0", 9);
  uint64_t version = 1;
  uint8_t code = 8;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  std::vector<int64_t> documents;
  // When set, written in place of the true counts.
  int64_t sequence_count = -1;
  int64_t entry_count = -1;
};

std::string IdxBytes(const IdxFields& f) {
  std::string out = f.magic;
  Put(out, f.version);
  out.push_back(static_cast<char>(f.code));
  Put(out, static_cast<uint64_t>(f.sequence_count >= 0 ? f.sequence_count
                                                       : f.lengths.size()));
  Put(out, static_cast<uint64_t>(f.entry_count >= 0 ? f.entry_count
                                                    : f.documents.size()));
  for (int32_t l : f.lengths) Put(out, static_cast<uint32_t>(l));
  for (int64_t p : f.pointers) Put(out, static_cast<uint64_t>(p));
  for (int64_t d : f.documents) Put(out, static_cast<uint64_t>(d));
  return out;
}

TEST(MegatronFormatTest, DTypeCodesAreMegatrons) {
  EXPECT_EQ(*MegatronDTypeFromCode(1), MegatronDType::kUint8);
  EXPECT_EQ(*MegatronDTypeFromCode(4), MegatronDType::kInt32);
  EXPECT_EQ(*MegatronDTypeFromCode(8), MegatronDType::kUint16);
  EXPECT_THAT(MegatronDTypeFromCode(0).status().message(),
              HasSubstr("unknown Megatron dtype code 0"));
  EXPECT_THAT(MegatronDTypeFromCode(99).status().message(),
              HasSubstr("unknown Megatron dtype code 99"));
  EXPECT_EQ(MegatronDTypeBytes(MegatronDType::kInt64), 8);
  EXPECT_EQ(MegatronDTypeBytes(MegatronDType::kUint16), 2);
  EXPECT_EQ(MegatronDTypeIdLimit(MegatronDType::kInt8), 128u);
  EXPECT_EQ(MegatronDTypeIdLimit(MegatronDType::kUint16), 65536u);
  EXPECT_FALSE(IsIntegerMegatronDType(MegatronDType::kFloat32));
  EXPECT_EQ(*ParseMegatronDType("int16"), MegatronDType::kInt16);
  EXPECT_THAT(ParseMegatronDType("bf16").status().message(),
              HasSubstr("allowed: uint8"));
  EXPECT_EQ(MegatronDTypeForVocab(65536), MegatronDType::kUint16);
  EXPECT_EQ(MegatronDTypeForVocab(128256), MegatronDType::kInt32);
}

TEST(MegatronWriterTest, WritesMegatronsLayoutByteForByte) {
  const std::string prefix = TempPrefix("layout");
  std::filesystem::remove(prefix + ".bin");
  std::filesystem::remove(prefix + ".idx");
  auto writer = MegatronWriter::Create(prefix, MegatronDType::kUint16);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddDocument({1, 2, 258}).ok());
  ASSERT_TRUE((*writer)->AddDocument({}).ok());
  ASSERT_TRUE((*writer)->AddDocument({65535}).ok());
  EXPECT_EQ((*writer)->documents(), 3);
  EXPECT_EQ((*writer)->tokens(), 4);
  // Nothing appears under the final names before Finish.
  EXPECT_FALSE(std::filesystem::exists(prefix + ".bin"));
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_THAT((*writer)->AddDocument({1}).message(), HasSubstr("finished"));
  EXPECT_EQ((*writer)->Finish().code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(ReadAll(prefix + ".bin"),
            std::string("\x01\x00\x02\x00\x02\x01\xff\xff", 8));
  IdxFields expected;
  expected.code = 8;
  expected.lengths = {3, 0, 1};
  expected.pointers = {0, 6, 6};
  expected.documents = {0, 1, 2, 3};
  EXPECT_EQ(ReadAll(prefix + ".idx"), IdxBytes(expected));
  // No temporary files are left beside the prefix.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(
           std::filesystem::path(prefix).parent_path())) {
    if (e.path().filename().string().rfind("megatron_test_layout", 0) == 0) {
      ++files;
    }
  }
  EXPECT_EQ(files, 2);
}

TEST(MegatronWriterTest, RoundTripsEveryIntegerDTypeThroughTheIndex) {
  for (int code : {1, 2, 3, 4, 5, 8}) {
    const MegatronDType dtype = *MegatronDTypeFromCode(code);
    const int64_t top = static_cast<int64_t>(
        std::min<uint64_t>(MegatronDTypeIdLimit(dtype) - 1, int64_t{1} << 40));
    const std::vector<std::vector<int64_t>> docs = {
        {0, 1, top}, {5}, {}, {top, 3}};
    const std::string prefix = TempPrefix(
        std::string("round_") + std::string(MegatronDTypeName(dtype)));
    auto writer = MegatronWriter::Create(prefix, dtype);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (const auto& d : docs) ASSERT_TRUE((*writer)->AddDocument(d).ok());
    ASSERT_TRUE((*writer)->Finish().ok());

    const std::string bin = ReadAll(prefix + ".bin");
    auto index =
        MegatronIndex::Open(prefix + ".idx", prefix + ".bin", bin.size());
    ASSERT_TRUE(index.ok()) << index.status();
    const MegatronIndex& idx = **index;
    EXPECT_EQ(idx.dtype(), dtype);
    EXPECT_EQ(idx.sequence_count(), 4);
    EXPECT_EQ(idx.document_count(), 4);
    EXPECT_EQ(idx.num_tokens(), 6);
    const int bytes = MegatronDTypeBytes(dtype);
    EXPECT_EQ(bin.size(), 6u * bytes);
    // Documents start at stream tokens 0, 3, 4, 4 (an empty one), 6 (end).
    EXPECT_EQ(idx.DocumentStart(0), 0);
    EXPECT_EQ(idx.DocumentStart(1), 3);
    EXPECT_EQ(idx.DocumentStart(2), 4);
    EXPECT_EQ(idx.DocumentStart(3), 4);
    EXPECT_EQ(idx.DocumentStart(4), 6);
    EXPECT_EQ(idx.DocumentAt(0), 0);
    EXPECT_EQ(idx.DocumentAt(2), 0);
    EXPECT_EQ(idx.DocumentAt(3), 1);
    EXPECT_EQ(idx.DocumentAt(4), 3);  // Skips the empty document 2.
    EXPECT_EQ(idx.DocumentAt(5), 3);
    // The ids, read back little-endian from the .bin.
    std::vector<int64_t> ids;
    for (size_t i = 0; i < bin.size(); i += bytes) {
      uint64_t v = 0;
      for (int b = 0; b < bytes; ++b) {
        v |= static_cast<uint64_t>(static_cast<uint8_t>(bin[i + b])) << (8 * b);
      }
      ids.push_back(static_cast<int64_t>(v));
    }
    EXPECT_THAT(ids, ElementsAre(0, 1, top, 5, top, 3))
        << MegatronDTypeName(dtype);
  }
}

TEST(MegatronWriterTest, RefusesIdsTheDTypeCannotHold) {
  auto writer =
      MegatronWriter::Create(TempPrefix("refuse"), MegatronDType::kInt8);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->AddDocument({1, 2}).ok());
  absl::Status s = (*writer)->AddDocument({3, 128});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      s.message(),
      HasSubstr("token 1 of document 1 is 128, which int8 cannot hold"));
  EXPECT_THAT((*writer)->AddDocument({-1}).message(), HasSubstr("is -1"));
  // A refused document is not written: the next one is document 1.
  ASSERT_TRUE((*writer)->AddDocument({7}).ok());
  EXPECT_EQ((*writer)->documents(), 2);
  EXPECT_EQ((*writer)->tokens(), 3);

  EXPECT_THAT(MegatronWriter::Create(TempPrefix("f32"), MegatronDType::kFloat32)
                  .status()
                  .message(),
              HasSubstr("cannot hold token ids"));
  EXPECT_EQ(MegatronWriter::Create(TempPrefix("no/such/dir/x"),
                                   MegatronDType::kUint16)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(MegatronWriterTest, AnUnfinishedWriterLeavesNothingBehind) {
  const std::string prefix = TempPrefix("abandoned");
  WriteBytes(prefix + ".bin", "old");
  {
    auto writer = MegatronWriter::Create(prefix, MegatronDType::kUint16);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->AddDocument({1, 2, 3}).ok());
  }
  EXPECT_EQ(ReadAll(prefix + ".bin"), "old");
  EXPECT_FALSE(std::filesystem::exists(prefix + ".idx"));
  for (const auto& e : std::filesystem::directory_iterator(
           std::filesystem::path(prefix).parent_path())) {
    EXPECT_THAT(e.path().filename().string(),
                ::testing::Not(HasSubstr("abandoned.bin.tmp")));
  }
}

// --- hostile indexes ---------------------------------------------------------

// A valid index of uint16 sequences of 3 and 2 tokens, one per document.
IdxFields GoodFields() {
  IdxFields f;
  f.lengths = {3, 2};
  f.pointers = {0, 6};
  f.documents = {0, 1, 2};
  return f;
}

absl::Status OpenError(const IdxFields& f, uint64_t bin_bytes = 10) {
  const std::string path = TempPrefix("hostile.idx");
  WriteBytes(path, IdxBytes(f));
  auto index = MegatronIndex::Open(path, "data.bin", bin_bytes);
  return index.status();
}

TEST(MegatronIndexTest, AcceptsTheGoodIndex) {
  EXPECT_TRUE(OpenError(GoodFields()).ok()) << OpenError(GoodFields());
}

TEST(MegatronIndexTest, RefusesHostileIndexes) {
  auto expect = [](const IdxFields& f, const std::string& substr,
                   uint64_t bin_bytes = 10) {
    absl::Status s = OpenError(f, bin_bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(substr));
  };
  IdxFields f = GoodFields();
  f.magic = std::string("MMIDIDY\0\0", 9);
  expect(f, "not a Megatron index");
  f = GoodFields();
  f.version = 2;
  expect(f, "version 2 at byte 9");
  f = GoodFields();
  f.code = 0;
  expect(f, "unknown Megatron dtype code 0");
  f.code = 99;
  expect(f, "byte 17: unknown Megatron dtype code 99");
  f.code = 6;
  expect(f, "dtype code 6 (float64) at byte 17 is not an integer type");
  f.code = 7;
  expect(f, "(float32)");
  // Counts that claim more than the file holds, including ones whose byte
  // sizes would overflow.
  f = GoodFields();
  f.sequence_count = 3;
  expect(f, "3 sequences (byte 18)");
  f.sequence_count = int64_t{1} << 62;
  expect(f, "need more bytes");
  f = GoodFields();
  f.entry_count = 2;
  expect(f, "but the file has");
  // Pointers past the .bin, or not back to back.
  f = GoodFields();
  expect(f, "runs past the end of data.bin (8 bytes)", 8);
  expect(f, "the sequences end at byte 10 but data.bin has 12", 12);
  f.pointers = {0, 8};
  expect(f,
         "sequence 1 starts at byte 8 of data.bin (pointer at byte 50), "
         "but sequence 0 ends at 6");
  f.pointers = {2, 8};
  expect(f, "the first must start at 0");
  f = GoodFields();
  f.lengths = {3, -2};
  expect(f, "sequence 1 has length -2 (byte 38)");
  // The document index.
  f = GoodFields();
  f.documents = {1, 1, 2};
  expect(f, "starts with 1 (byte 58), not 0");
  f.documents = {0, 2, 1};
  expect(f, "document index entry 2 is 1 (byte 74)");
  f.documents = {0, 1, 3};
  expect(f, "entry 2 is 3");
  f.documents = {0, 1, 1};
  expect(f, "ends at sequence 1 (byte 74), not at the sequence count 2");
  f.documents = {};
  expect(f, "the document index is empty");

  const std::string short_file = TempPrefix("short.idx");
  WriteBytes(short_file, "MMIDIDX");
  EXPECT_THAT(MegatronIndex::Open(short_file, "b", 0).status().message(),
              HasSubstr("too short for a Megatron index header"));
  EXPECT_EQ(MegatronIndex::Open(TempPrefix("none.idx"), "b", 0).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace conveyor::engine
