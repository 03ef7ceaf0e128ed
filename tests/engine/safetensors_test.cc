#include "engine/safetensors.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The 8-byte little-endian length prefix.
std::string Le64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

// A file from a header JSON text and a data buffer, built by hand rather
// than by the writer under test.
std::string MakeFile(const std::string& header, const std::string& data) {
  return Le64(header.size()) + header + data;
}

template <typename T>
std::string BytesOf(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string ToString(std::span<const uint8_t> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TensorToWrite Tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                     const std::string& bytes) {
  return TensorToWrite{std::move(name), dtype, std::move(shape), bytes.data(),
                       bytes.size()};
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// gmock's string matchers take std::string, not Debian's absl::string_view.
std::string Msg(const absl::Status& status) {
  return std::string(status.message());
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// ---------------------------------------------------------------------------
// Round trips and the byte format

TEST(SafetensorsTest, RoundTripKeepsEveryDtypeShapeAndMetadata) {
  const std::string f32 =
      BytesOf<float>({1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f});
  const std::string f64 = BytesOf<double>({1e300, -0.125});
  const std::string f16 = BytesOf<uint16_t>({0x3C00, 0xC000, 0x7C00});
  const std::string bf16 = BytesOf<uint16_t>({0x3F80, 0x4000});
  const std::string i64 = BytesOf<int64_t>({-1, 1LL << 40});
  const std::string i32 = BytesOf<int32_t>({-7});
  const std::string i16 = BytesOf<int16_t>({-300, 300});
  const std::string i8 = BytesOf<int8_t>({-128, 127, 0});
  const std::string u8 = BytesOf<uint8_t>({255, 0, 1, 2, 3});
  const std::string u16 = BytesOf<uint16_t>({65535});
  const std::string u32 = BytesOf<uint32_t>({4000000000u, 1});
  const std::string u64 = BytesOf<uint64_t>({12345678901234ULL});
  const std::string boolean = BytesOf<uint8_t>({1, 0, 1});
  const std::string scalar = BytesOf<float>({42.0f});
  const std::string empty;
  const std::vector<TensorToWrite> tensors = {
      Tensor("f32", DType::kF32, {2, 3}, f32),
      Tensor("f64", DType::kF64, {2}, f64),
      Tensor("f16", DType::kF16, {3}, f16),
      Tensor("bf16", DType::kBF16, {1, 2}, bf16),
      Tensor("i64", DType::kI64, {2}, i64),
      Tensor("i32", DType::kI32, {1, 1, 1}, i32),
      Tensor("i16", DType::kI16, {2}, i16),
      Tensor("i8", DType::kI8, {3}, i8),
      Tensor("u8", DType::kU8, {5}, u8),
      Tensor("u16", DType::kU16, {1}, u16),
      Tensor("u32", DType::kU32, {2}, u32),
      Tensor("u64", DType::kU64, {1}, u64),
      Tensor("bool", DType::kBool, {3}, boolean),
      Tensor("scalar", DType::kF32, {}, scalar),
      Tensor("empty_f32", DType::kF32, {0, 5}, empty),
      Tensor("empty_i8", DType::kI8, {3, 0}, empty),
  };
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "1200"}, {"note", "ünïcode"}};

  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, metadata);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::FromBytes(*bytes);
  ASSERT_TRUE(reader.ok()) << reader.status();

  EXPECT_EQ(reader->metadata(), metadata);
  ASSERT_EQ(reader->tensors().size(), tensors.size());
  for (const TensorToWrite& want : tensors) {
    SCOPED_TRACE(want.name);
    const TensorInfo* got = reader->Find(want.name);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->name, want.name);
    EXPECT_EQ(got->dtype, want.dtype);
    EXPECT_EQ(got->shape, want.shape);
    EXPECT_EQ(got->bytes(), want.bytes);
    absl::StatusOr<std::span<const uint8_t>> raw = reader->RawBytes(want.name);
    ASSERT_TRUE(raw.ok());
    EXPECT_EQ(ToString(*raw),
              std::string(static_cast<const char*>(want.data), want.bytes));
  }
  EXPECT_EQ(reader->Find("scalar")->numel(), 1);
  EXPECT_EQ(reader->Find("empty_f32")->numel(), 0);
  EXPECT_EQ(reader->Find("f32")->numel(), 6);
  EXPECT_THAT(*reader->ReadF32("scalar"), ElementsAre(42.0f));
  EXPECT_TRUE(reader->ReadF32("empty_f32")->empty());
  EXPECT_THAT(*reader->ReadI64("u32"), ElementsAre(4000000000LL, 1));
}

TEST(SafetensorsTest, WriterAlignsEachTensorAndIgnoresInputOrder) {
  const std::string u8 = BytesOf<uint8_t>({1, 2, 3});
  const std::string f16 = BytesOf<uint16_t>({0x3C00});
  const std::string f64 = BytesOf<double>({1.0, 2.0});
  const std::string f32 = BytesOf<float>({1.0f});
  std::vector<TensorToWrite> tensors = {
      Tensor("a_u8", DType::kU8, {3}, u8),
      Tensor("b_f16", DType::kF16, {1}, f16),
      Tensor("c_f64", DType::kF64, {2}, f64),
      Tensor("d_f32", DType::kF32, {1}, f32),
  };
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // The data buffer starts on an 8-byte boundary...
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes->data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  // ...and each tensor on a multiple of its element size: largest first.
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::FromBytes(*bytes);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> order;
  for (const TensorInfo& t : reader->tensors()) {
    order.push_back(t.name);
    EXPECT_EQ(t.begin % DTypeSize(t.dtype), 0u) << t.name;
  }
  EXPECT_THAT(order, ElementsAre("c_f64", "d_f32", "b_f16", "a_u8"));

  std::reverse(tensors.begin(), tensors.end());
  absl::StatusOr<std::string> reversed = SerializeSafetensors(tensors);
  ASSERT_TRUE(reversed.ok());
  EXPECT_EQ(*reversed, *bytes);
}

// The exact bytes the reference implementation (huggingface/safetensors,
// bindings/python/tests) produces for {"test": zeros((2, 2), int32)}.
TEST(SafetensorsTest, WriterMatchesReferenceImplementationBytes) {
  const std::string zeros(16, '\0');
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors({Tensor("test", DType::kI32, {2, 2}, zeros)});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string reference =
      std::string("@\0\0\0\0\0\0\0", 8) +
      R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})"
      "    " +
      zeros;
  EXPECT_EQ(*bytes, reference);
}

// A file assembled byte by byte. The header is padded to 264 = 0x108 bytes,
// so the length prefix reads 08 01 00 .. 00: little-endian, or the reader
// would look for 0x0801000000000000 bytes and fail.
TEST(SafetensorsTest, ParsesHandAssembledFile) {
  std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"shape":[],"data_offsets":[8,10],"dtype":"I16"}})";
  header.append(264 - header.size(), ' ');
  const std::string data(
      "\x00\x00\x80\x3f"  // 1.0f
      "\x00\x00\x00\xc0"  // -2.0f
      "\x34\x12",         // int16 0x1234
      10);
  std::string file = std::string("\x08\x01\0\0\0\0\0\0", 8) + header + data;
  ASSERT_EQ(file.substr(0, 8), Le64(264));

  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::FromBytes(file, "hand.safetensors");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->source_name(), "hand.safetensors");
  EXPECT_THAT(
      reader->metadata(),
      ElementsAre(std::pair<const std::string, std::string>("format", "pt")));
  // tensors() is in offset order, not name order.
  ASSERT_EQ(reader->tensors().size(), 2u);
  EXPECT_EQ(reader->tensors()[0].name, "b");
  EXPECT_EQ(reader->tensors()[1].name, "a");
  const TensorInfo* a = reader->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kI16);
  EXPECT_TRUE(a->shape.empty());
  EXPECT_EQ(a->begin, 8u);
  EXPECT_EQ(a->end, 10u);
  EXPECT_EQ(a->numel(), 1);
  EXPECT_THAT(*reader->ReadF32("b"), ElementsAre(1.0f, -2.0f));
  EXPECT_THAT(*reader->ReadI64("a"), ElementsAre(0x1234));
}

TEST(SafetensorsTest, NullMetadataAndEmptyHeaderAreAccepted) {
  absl::StatusOr<SafetensorsReader> null_metadata =
      SafetensorsReader::FromBytes(MakeFile(R"({"__metadata__":null})", ""));
  ASSERT_TRUE(null_metadata.ok()) << null_metadata.status();
  EXPECT_TRUE(null_metadata->metadata().empty());
  EXPECT_TRUE(null_metadata->tensors().empty());

  absl::StatusOr<SafetensorsReader> empty =
      SafetensorsReader::FromBytes(MakeFile("{}", ""));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->tensors().empty());
}

// A zero dimension makes the tensor empty however large the other
// dimensions are; it must not be mistaken for an overflow.
TEST(SafetensorsTest, ZeroDimensionBesideHugeDimensionIsEmpty) {
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::FromBytes(MakeFile(
      R"({"e":{"dtype":"F64","shape":[9223372036854775807,9223372036854775807,0],"data_offsets":[0,0]}})",
      ""));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->Find("e")->numel(), 0);
  EXPECT_TRUE(reader->ReadF32("e")->empty());
}

// ---------------------------------------------------------------------------
// Conversions

TEST(SafetensorsTest, ReadF32ConvertsHalfBFloatAndDoubleExactly) {
  const std::string f16 = BytesOf<uint16_t>({
      0x3C00,  // 1
      0xC000,  // -2
      0x3555,  // 0.333251953125
      0x0001,  // smallest subnormal 2^-24
      0x03FF,  // largest subnormal 1023 * 2^-24
      0x0400,  // smallest normal 2^-14
      0x7BFF,  // largest finite 65504
      0x7C00,  // +inf
      0xFC00,  // -inf
      0x7E00,  // NaN
      0x8000,  // -0
  });
  const std::string bf16 = BytesOf<uint16_t>({
      0x3F80,  // 1
      0xC0A0,  // -5
      0x7F80,  // +inf
      0x0001,  // bf16 subnormal: float bits 0x00010000
      0x7FC0,  // NaN
  });
  const std::string f64 = BytesOf<double>({
      0.1, -1.0 / 3.0, 1e300, -1e300,
      static_cast<double>(std::numeric_limits<float>::max()),
      0x1.fffffefffffffp127,  // just below FLT_MAX + half ulp: rounds down
      0x1.ffffffp127,         // exactly half an ulp above: ties to inf
      1e-50,                  // underflows to 0
  });
  absl::StatusOr<std::string> bytes = SerializeSafetensors({
      Tensor("h", DType::kF16, {11}, f16),
      Tensor("bf", DType::kBF16, {5}, bf16),
      Tensor("d", DType::kF64, {8}, f64),
  });
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::FromBytes(*bytes);
  ASSERT_TRUE(reader.ok()) << reader.status();

  absl::StatusOr<std::vector<float>> h = reader->ReadF32("h");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->size(), 11u);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ((*h)[0], 1.0f);
  EXPECT_EQ((*h)[1], -2.0f);
  EXPECT_EQ((*h)[2], 0.333251953125f);
  EXPECT_EQ((*h)[3], 0x1p-24f);
  EXPECT_EQ((*h)[4], 1023 * 0x1p-24f);
  EXPECT_EQ((*h)[5], 0x1p-14f);
  EXPECT_EQ((*h)[6], 65504.0f);
  EXPECT_EQ((*h)[7], kInf);
  EXPECT_EQ((*h)[8], -kInf);
  EXPECT_TRUE(std::isnan((*h)[9]));
  EXPECT_EQ((*h)[10], 0.0f);
  EXPECT_TRUE(std::signbit((*h)[10]));

  absl::StatusOr<std::vector<float>> bf = reader->ReadF32("bf");
  ASSERT_TRUE(bf.ok()) << bf.status();
  ASSERT_EQ(bf->size(), 5u);
  EXPECT_EQ((*bf)[0], 1.0f);
  EXPECT_EQ((*bf)[1], -5.0f);
  EXPECT_EQ((*bf)[2], kInf);
  EXPECT_EQ(std::bit_cast<uint32_t>((*bf)[3]), 0x00010000u);
  EXPECT_TRUE(std::isnan((*bf)[4]));

  absl::StatusOr<std::vector<float>> d = reader->ReadF32("d");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 8u);
  EXPECT_EQ((*d)[0], 0.1f);
  EXPECT_EQ((*d)[1], -1.0f / 3.0f);
  EXPECT_EQ((*d)[2], kInf);
  EXPECT_EQ((*d)[3], -kInf);
  EXPECT_EQ((*d)[4], std::numeric_limits<float>::max());
  EXPECT_EQ((*d)[5], std::numeric_limits<float>::max());
  EXPECT_EQ((*d)[6], kInf);
  EXPECT_EQ((*d)[7], 0.0f);
}

TEST(SafetensorsTest, ReadI64WidensEveryIntegerType) {
  const std::string i8 = BytesOf<int8_t>({-128, 127});
  const std::string u8 = BytesOf<uint8_t>({0, 255});
  const std::string i16 = BytesOf<int16_t>({-32768, 32767});
  const std::string u16 = BytesOf<uint16_t>({65535});
  const std::string i32 =
      BytesOf<int32_t>({std::numeric_limits<int32_t>::min()});
  const std::string u32 = BytesOf<uint32_t>({4294967295u});
  const std::string i64 =
      BytesOf<int64_t>({std::numeric_limits<int64_t>::min(), 5});
  const std::string u64 =
      BytesOf<uint64_t>({uint64_t{std::numeric_limits<int64_t>::max()}});
  const std::string boolean = BytesOf<uint8_t>({0, 1, 1});
  absl::StatusOr<std::string> bytes = SerializeSafetensors({
      Tensor("i8", DType::kI8, {2}, i8),
      Tensor("u8", DType::kU8, {2}, u8),
      Tensor("i16", DType::kI16, {2}, i16),
      Tensor("u16", DType::kU16, {1}, u16),
      Tensor("i32", DType::kI32, {1}, i32),
      Tensor("u32", DType::kU32, {1}, u32),
      Tensor("i64", DType::kI64, {2}, i64),
      Tensor("u64", DType::kU64, {1}, u64),
      Tensor("bool", DType::kBool, {3}, boolean),
  });
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::FromBytes(*bytes);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_THAT(*reader->ReadI64("i8"), ElementsAre(-128, 127));
  EXPECT_THAT(*reader->ReadI64("u8"), ElementsAre(0, 255));
  EXPECT_THAT(*reader->ReadI64("i16"), ElementsAre(-32768, 32767));
  EXPECT_THAT(*reader->ReadI64("u16"), ElementsAre(65535));
  EXPECT_THAT(*reader->ReadI64("i32"),
              ElementsAre(std::numeric_limits<int32_t>::min()));
  EXPECT_THAT(*reader->ReadI64("u32"), ElementsAre(4294967295LL));
  EXPECT_THAT(*reader->ReadI64("i64"),
              ElementsAre(std::numeric_limits<int64_t>::min(), 5));
  EXPECT_THAT(*reader->ReadI64("u64"),
              ElementsAre(std::numeric_limits<int64_t>::max()));
  EXPECT_THAT(*reader->ReadI64("bool"), ElementsAre(0, 1, 1));
}

TEST(SafetensorsTest, ReadI64RejectsUnrepresentableValues) {
  const std::string u64 = BytesOf<uint64_t>({1, uint64_t{1} << 63});
  const std::string boolean = BytesOf<uint8_t>({1, 2});
  absl::StatusOr<std::string> bytes = SerializeSafetensors({
      Tensor("big", DType::kU64, {2}, u64),
      Tensor("flag", DType::kBool, {2}, boolean),
  });
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::FromBytes(*bytes, "x.safetensors");
  ASSERT_TRUE(reader.ok()) << reader.status();

  absl::StatusOr<std::vector<int64_t>> big = reader->ReadI64("big");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(big.status()),
              HasSubstr("x.safetensors: tensor 'big': U64 element 1 is "
                        "9223372036854775808"));
  absl::StatusOr<std::vector<int64_t>> flag = reader->ReadI64("flag");
  EXPECT_EQ(flag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(flag.status()),
              HasSubstr("tensor 'flag': BOOL element 1 is 2"));
}

TEST(SafetensorsTest, ReadsRejectWrongKindAndMissingTensor) {
  const std::string i32 = BytesOf<int32_t>({1, 2});
  const std::string f32 = BytesOf<float>({1.0f});
  absl::StatusOr<std::string> bytes = SerializeSafetensors({
      Tensor("ids", DType::kI32, {2}, i32),
      Tensor("w", DType::kF32, {1}, f32),
  });
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::FromBytes(*bytes, "m.safetensors");
  ASSERT_TRUE(reader.ok()) << reader.status();

  absl::StatusOr<std::vector<float>> as_float = reader->ReadF32("ids");
  EXPECT_EQ(as_float.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(as_float.status()),
              HasSubstr("m.safetensors: tensor 'ids' is I32, not a floating"));
  absl::StatusOr<std::vector<int64_t>> as_int = reader->ReadI64("w");
  EXPECT_EQ(as_int.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(as_int.status()),
              HasSubstr("tensor 'w' is F32, not an integer"));

  EXPECT_EQ(reader->Find("missing"), nullptr);
  EXPECT_EQ(reader->ReadF32("missing").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reader->ReadI64("missing").status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::span<const uint8_t>> raw = reader->RawBytes("missing");
  EXPECT_EQ(raw.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(raw.status()), HasSubstr("no tensor 'missing'"));
}

// ---------------------------------------------------------------------------
// Validation: every inconsistency is an InvalidArgument naming the source.

struct BadFile {
  std::string label;
  std::string bytes;
  std::string expected_message;
};

std::vector<BadFile> BadFiles() {
  // Openings of a U8 [4] entry; the caller adds "data_offsets".
  const std::string u8x4 = R"({"dtype":"U8","shape":[4],)";
  const std::string a4 = R"({"a":)" + u8x4;
  return {
      {"empty file", "", "0 bytes, too short for the 8-byte header size"},
      {"truncated length", std::string("\x02\0\0\0\0\0\0", 7),
       "7 bytes, too short"},
      {"header size beyond file", Le64(100) + std::string(10, ' '),
       "header size 100 exceeds the 10 bytes after the size field"},
      {"huge header size", Le64(uint64_t{1} << 40) + "{}",
       "header size 1099511627776 exceeds the limit of 104857600 bytes"},
      {"all-ones header size", Le64(~uint64_t{0}) + "{}", "exceeds the limit"},
      {"invalid json", MakeFile(R"({"a":)", ""), "header is not valid JSON"},
      {"trailing garbage", MakeFile("{} x", ""), "header is not valid JSON"},
      {"nul padding", MakeFile(std::string("{}\0\0", 4), ""),
       "header is not valid JSON"},
      {"invalid utf-8", MakeFile("{\"\xff\":{}}", ""),
       "header is not valid JSON"},
      {"non-object header", MakeFile("[1,2]", ""),
       "header must be a JSON object, got array"},
      {"entry not an object", MakeFile(R"({"a":3})", ""),
       "tensor 'a': entry must be an object, got number"},
      {"unknown field",
       MakeFile(R"({"a":{"dtype":"U8","shape":[],"offsets":[0,1]}})", "x"),
       "tensor 'a': unknown field 'offsets'"},
      {"missing dtype",
       MakeFile(R"({"a":{"shape":[],"data_offsets":[0,1]}})", "x"),
       "tensor 'a': \"dtype\" must be a string"},
      {"bad dtype",
       MakeFile(R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})",
                "x"),
       "tensor 'a': unknown dtype 'F8_E4M3'"},
      {"missing shape",
       MakeFile(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", "x"),
       "tensor 'a': \"shape\" must be an array"},
      {"negative shape",
       MakeFile(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})",
                ""),
       "tensor 'a': shape[0] is out of range; the shape must hold "
       "non-negative integers"},
      {"deeply nested shape element (refused before the library parses it)",
       MakeFile(std::string(R"({"a":{"dtype":"U8","shape":[)") +
                    std::string(200000, '[') + std::string(200000, ']') +
                    R"(],"data_offsets":[0,0]}})",
                ""),
       "header is nested deeper than 8 levels"},
      {"fractional shape",
       MakeFile(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})",
                ""),
       "shape[0] has JSON type number; the shape must hold non-negative "
       "integers"},
      {"shape beyond int64",
       MakeFile(
           R"({"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})",
           ""),
       "below 2^63"},
      {"missing offsets", MakeFile(R"({"a":{"dtype":"U8","shape":[1]}})", "x"),
       "tensor 'a': \"data_offsets\" must be [begin, end]"},
      {"one offset", MakeFile(a4 + R"("data_offsets":[4]}})", "xxxx"),
       "\"data_offsets\" must be [begin, end]"},
      {"negative offset", MakeFile(a4 + R"("data_offsets":[-4,0]}})", ""),
       "\"data_offsets\" must be [begin, end]"},
      {"offsets reversed", MakeFile(a4 + R"("data_offsets":[4,0]}})", ""),
       "data_offsets [4, 0] end before they begin"},
      {"offsets beyond buffer",
       MakeFile(a4 + R"("data_offsets":[0,4]}})", "xx"),
       "tensor 'a': data_offsets [0, 4] exceed the data buffer of 2 bytes"},
      {"offsets near 2^64",
       MakeFile(
           a4 +
               R"("data_offsets":[18446744073709551612,18446744073709551615]}})",
           "xxxx"),
       "exceed the data buffer of 4 bytes"},
      {"size mismatch",
       MakeFile(
           R"({"layers.0.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
           std::string(12, 'x')),
       "tensor 'layers.0.weight': data_offsets [0, 12] hold 12 bytes but F32 "
       "[2, 2] needs 16"},
      {"overflowing shape product",
       MakeFile(
           R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
           ""),
       "tensor 'a': shape [4294967296, 4294967296] has more elements than "
       "fit in 64 bits"},
      {"overflowing byte size",
       MakeFile(
           R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})",
           ""),
       "has more elements than fit in 64 bits"},
      {"overlap",
       MakeFile(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                std::string(12, 'x')),
       "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]"},
      {"empty tensor inside another",
       MakeFile(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})",
                std::string(8, 'x')),
       "tensor 'b': data_offsets [4, 4] overlap tensor 'a'"},
      {"hole",
       MakeFile(a4 + R"("data_offsets":[0,4]},"b":)" + u8x4 +
                    R"("data_offsets":[8,12]}})",
                std::string(12, 'x')),
       "bytes [4, 8) of the data buffer belong to no tensor (before 'b')"},
      {"hole at start",
       MakeFile(a4 + R"("data_offsets":[4,8]}})", std::string(8, 'x')),
       "bytes [0, 4) of the data buffer belong to no tensor"},
      {"trailing bytes",
       MakeFile(a4 + R"("data_offsets":[0,4]}})", std::string(8, 'x')),
       "data buffer is 8 bytes but the tensors cover only 4"},
      {"data without tensors", MakeFile("{}", "x"),
       "data buffer is 1 bytes but the tensors cover only 0"},
      {"duplicate name",
       MakeFile(a4 + R"("data_offsets":[0,4]},"a":)" + u8x4 +
                    R"("data_offsets":[4,8]}})",
                std::string(8, 'x')),
       "header has duplicate tensor name 'a'"},
      {"duplicate field",
       MakeFile(
           R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})",
           "x"),
       "header has duplicate key 'dtype'"},
      {"duplicate metadata",
       MakeFile(R"({"__metadata__":{},"__metadata__":{}})", ""),
       "duplicate tensor name '__metadata__'"},
      {"non-string metadata value",
       MakeFile(R"({"__metadata__":{"epoch":3}})", ""),
       "__metadata__ value for 'epoch' must be a string, got number"},
      {"non-object metadata", MakeFile(R"({"__metadata__":["a"]})", ""),
       "__metadata__ must be an object, got array"},
  };
}

TEST(SafetensorsTest, RejectsEveryInconsistency) {
  for (const BadFile& bad : BadFiles()) {
    SCOPED_TRACE(bad.label);
    absl::StatusOr<SafetensorsReader> reader =
        SafetensorsReader::FromBytes(bad.bytes, "params.safetensors");
    ASSERT_FALSE(reader.ok());
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(reader.status()), StartsWith("params.safetensors: "));
    EXPECT_THAT(Msg(reader.status()), HasSubstr(bad.expected_message));
  }
}

// ---------------------------------------------------------------------------
// Robustness: damaged copies of a valid file either parse into something
// self-consistent or fail with a status; none may crash or read out of
// bounds (run under ASan to catch the latter).

// Checks the invariants a successfully parsed file promises, reading every
// tensor through every accessor.
void ExpectConsistent(const SafetensorsReader& reader, size_t file_size) {
  uint64_t covered = 0;
  for (const TensorInfo& t : reader.tensors()) {
    ASSERT_EQ(t.begin, covered);
    ASSERT_EQ(t.bytes(), static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype));
    covered = t.end;
    EXPECT_EQ(reader.Find(t.name), &t);
    std::span<const uint8_t> raw = reader.RawBytes(t);
    ASSERT_EQ(raw.size(), t.bytes());
    // Touch every byte so ASan sees any out-of-bounds span.
    volatile uint8_t sink = 0;
    for (uint8_t b : raw) sink = sink ^ b;
    if (IsFloatingPoint(t.dtype)) {
      absl::StatusOr<std::vector<float>> v = reader.ReadF32(t.name);
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(v->size(), static_cast<size_t>(t.numel()));
    } else {
      absl::StatusOr<std::vector<int64_t>> v = reader.ReadI64(t.name);
      // U64 and BOOL values can be unrepresentable after a flip.
      if (v.ok()) {
        EXPECT_EQ(v->size(), static_cast<size_t>(t.numel()));
      }
    }
  }
  EXPECT_LE(covered, file_size);
}

std::string FuzzSeedFile() {
  static const std::string f32 = BytesOf<float>({1.0f, 2.0f, 3.0f, 4.0f});
  static const std::string bf16 = BytesOf<uint16_t>({0x3F80, 0x4000});
  static const std::string f16 = BytesOf<uint16_t>({0x3C00});
  static const std::string i64 = BytesOf<int64_t>({7, -7});
  static const std::string u64 = BytesOf<uint64_t>({9});
  static const std::string boolean = BytesOf<uint8_t>({1, 0});
  static const std::string u8 = BytesOf<uint8_t>({1, 2, 3});
  static const std::string scalar = BytesOf<double>({0.5});
  absl::StatusOr<std::string> bytes = SerializeSafetensors(
      {
          Tensor("w", DType::kF32, {2, 2}, f32),
          Tensor("b", DType::kBF16, {2}, bf16),
          Tensor("h", DType::kF16, {1}, f16),
          Tensor("ids", DType::kI64, {2}, i64),
          Tensor("n", DType::kU64, {1}, u64),
          Tensor("mask", DType::kBool, {2}, boolean),
          Tensor("u", DType::kU8, {3}, u8),
          Tensor("s", DType::kF64, {}, scalar),
          Tensor("e", DType::kF32, {0, 3}, ""),
      },
      {{"format", "pt"}});
  return bytes.ok() ? *bytes : std::string();
}

TEST(SafetensorsTest, EveryTruncationIsAnError) {
  const std::string file = FuzzSeedFile();
  ASSERT_FALSE(file.empty());
  ASSERT_TRUE(SafetensorsReader::FromBytes(file).ok());
  for (size_t length = 0; length < file.size(); ++length) {
    absl::StatusOr<SafetensorsReader> reader =
        SafetensorsReader::FromBytes(file.substr(0, length));
    EXPECT_FALSE(reader.ok()) << "length " << length;
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(SafetensorsTest, FlippedBytesNeverCrash) {
  const std::string file = FuzzSeedFile();
  ASSERT_FALSE(file.empty());
  int accepted = 0;
  int rejected = 0;
  for (size_t pos = 0; pos < file.size(); ++pos) {
    for (uint8_t mask : {0x01, 0x02, 0x10, 0x20, 0x80, 0xFF}) {
      std::string damaged = file;
      damaged[pos] = static_cast<char>(damaged[pos] ^ mask);
      absl::StatusOr<SafetensorsReader> reader =
          SafetensorsReader::FromBytes(damaged);
      if (reader.ok()) {
        ++accepted;
        ExpectConsistent(*reader, damaged.size());
      } else {
        ++rejected;
        EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument)
            << reader.status();
      }
    }
  }
  // Flips in the data buffer (and many in names) still parse; flips in the
  // length prefix and structure do not. Both must have happened.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

TEST(SafetensorsTest, RandomMultiByteDamageNeverCrashes) {
  const std::string file = FuzzSeedFile();
  ASSERT_FALSE(file.empty());
  std::mt19937 rng(20240611);  // Fixed: failures must reproduce.
  std::uniform_int_distribution<size_t> position(0, file.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  // Characters that steer the JSON parser into other branches.
  const std::string structural = "{}[]\",:-0123456789.eE \\u";
  std::uniform_int_distribution<size_t> pick(0, structural.size() - 1);
  int rejected = 0;
  for (int iteration = 0; iteration < 20000; ++iteration) {
    std::string damaged = file;
    const int edits = 1 + iteration % 4;
    for (int e = 0; e < edits; ++e) {
      const size_t at = position(rng);
      damaged[at] = (rng() % 2 == 0) ? static_cast<char>(byte(rng))
                                     : structural[pick(rng)];
    }
    if (iteration % 5 == 0) damaged.resize(position(rng));
    absl::StatusOr<SafetensorsReader> reader =
        SafetensorsReader::FromBytes(damaged);
    if (reader.ok()) {
      ExpectConsistent(*reader, damaged.size());
    } else {
      ++rejected;
      EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(rejected, 0);
}

// ---------------------------------------------------------------------------
// Writer argument validation

TEST(SafetensorsTest, SerializeRejectsBadArguments) {
  const std::string four = BytesOf<float>({1.0f});
  struct Case {
    std::string label;
    std::vector<TensorToWrite> tensors;
    std::map<std::string, std::string> metadata;
    std::string expected_message;
  };
  const std::vector<Case> cases = {
      {"empty name", {Tensor("", DType::kF32, {1}, four)}, {}, "empty"},
      {"reserved name",
       {Tensor("__metadata__", DType::kF32, {1}, four)},
       {},
       "tensor '__metadata__': the name is reserved"},
      {"duplicate",
       {Tensor("a", DType::kF32, {1}, four),
        Tensor("a", DType::kF32, {1}, four)},
       {},
       "tensor 'a': name given twice"},
      {"negative dim",
       {Tensor("a", DType::kF32, {-1}, "")},
       {},
       "shape [-1] has a negative size"},
      {"bytes mismatch",
       {Tensor("a", DType::kF32, {2}, four)},
       {},
       "tensor 'a': 4 bytes given but F32 [2] needs 8"},
      {"overflow",
       {Tensor("a", DType::kF32, {1LL << 62, 1LL << 62}, four)},
       {},
       "more elements than fit in 64 bits"},
      {"null data",
       {TensorToWrite{"a", DType::kF32, {1}, nullptr, 4}},
       {},
       "tensor 'a': data is null"},
      {"non-utf8 name",
       {Tensor("bad\xff", DType::kF32, {1}, four)},
       {},
       "valid UTF-8"},
      {"non-utf8 metadata",
       {Tensor("a", DType::kF32, {1}, four)},
       {{"k", "\xc3"}},
       "valid UTF-8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    absl::StatusOr<std::string> bytes =
        SerializeSafetensors(c.tensors, c.metadata);
    ASSERT_FALSE(bytes.ok());
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(bytes.status()), HasSubstr(c.expected_message));
  }
}

// ---------------------------------------------------------------------------
// Files

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "safetensors_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

TEST_F(SafetensorsFileTest, WriteThenOpenRoundTrips) {
  const std::string f32 = BytesOf<float>({1.0f, 2.0f});
  const std::string path = Path("params.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {Tensor("w", DType::kF32, {2}, f32)},
                               {{"step", "3"}})
                  .ok());
  EXPECT_THAT(ListDir(dir_), ElementsAre("params.safetensors"));

  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->source_name(), path);
  EXPECT_THAT(*reader->ReadF32("w"), ElementsAre(1.0f, 2.0f));
  EXPECT_EQ(reader->metadata().at("step"), "3");
  // The file holds exactly what SerializeSafetensors returns.
  absl::StatusOr<std::string> bytes = SerializeSafetensors(
      {Tensor("w", DType::kF32, {2}, f32)}, {{"step", "3"}});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(ReadFileOrDie(path), *bytes);
}

TEST_F(SafetensorsFileTest, WriteOverwritesExistingFile) {
  const std::string path = Path("params.safetensors");
  const std::string first = BytesOf<float>({1.0f, 2.0f, 3.0f});
  const std::string second = BytesOf<int64_t>({9});
  ASSERT_TRUE(
      WriteSafetensors(path, {Tensor("old", DType::kF32, {3}, first)}).ok());
  ASSERT_TRUE(
      WriteSafetensors(path, {Tensor("new", DType::kI64, {1}, second)}).ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->Find("old"), nullptr);
  EXPECT_THAT(*reader->ReadI64("new"), ElementsAre(9));
  EXPECT_THAT(ListDir(dir_), ElementsAre("params.safetensors"));
}

TEST_F(SafetensorsFileTest, WriteIntoMissingDirectoryFailsAndLeavesNothing) {
  const std::string path = Path("no/such/dir/params.safetensors");
  const std::string f32 = BytesOf<float>({1.0f});
  absl::Status status =
      WriteSafetensors(path, {Tensor("w", DType::kF32, {1}, f32)});
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(status), HasSubstr(path));
  EXPECT_THAT(Msg(status), HasSubstr("No such file or directory"));
  EXPECT_TRUE(ListDir(dir_).empty());
}

TEST_F(SafetensorsFileTest, FailedRenameRemovesTemporaryFile) {
  // A non-empty directory at the destination makes rename() fail after the
  // temporary file has been fully written.
  const std::string path = Path("taken");
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((path + "/child").c_str(), 0755), 0);
  const std::string f32 = BytesOf<float>({1.0f});
  absl::Status status =
      WriteSafetensors(path, {Tensor("w", DType::kF32, {1}, f32)});
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(Msg(status), HasSubstr("rename"));
  EXPECT_THAT(ListDir(dir_), ElementsAre("taken"));
}

TEST_F(SafetensorsFileTest, InvalidWriteLeavesExistingFileUntouched) {
  const std::string path = Path("params.safetensors");
  const std::string f32 = BytesOf<float>({1.0f});
  ASSERT_TRUE(
      WriteSafetensors(path, {Tensor("w", DType::kF32, {1}, f32)}).ok());
  const std::string before = ReadFileOrDie(path);
  absl::Status status =
      WriteSafetensors(path, {Tensor("w", DType::kF32, {2}, f32)});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadFileOrDie(path), before);
  EXPECT_THAT(ListDir(dir_), ElementsAre("params.safetensors"));
}

TEST_F(SafetensorsFileTest, OpenReportsMissingFileAndDirectory) {
  absl::StatusOr<SafetensorsReader> missing =
      SafetensorsReader::Open(Path("absent.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), HasSubstr("absent.safetensors"));

  absl::StatusOr<SafetensorsReader> directory = SafetensorsReader::Open(dir_);
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(directory.status()), HasSubstr("not a regular file"));
}

TEST_F(SafetensorsFileTest, OpenNamesThePathInFormatErrors) {
  const std::string path = Path("short.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    out << Le64(64) << "{}";
  }
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(reader.status()),
              StartsWith(path + ": header size 64 exceeds"));
}

}  // namespace
}  // namespace conveyor::engine
