#include "transport/tensor_header.h"

#include <array>
#include <cstring>
#include <functional>
#include <string>

#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::transport {
namespace {

using ::testing::HasSubstr;

using Bytes = std::array<uint8_t, kTensorHeaderSize>;

constexpr uint64_t kJob = 7;
constexpr uint64_t kMax = uint64_t{1} << 30;
constexpr int kNumDTypes = static_cast<int>(engine::DType::kBool) + 1;

TensorHeader Header(engine::Shape shape,
                    engine::DType dtype = engine::DType::kF32,
                    TensorKind kind = TensorKind::kGradient) {
  TensorHeader h;
  h.tag = {.job = kJob, .step = 5, .microbatch = 3, .stage = 1, .kind = kind};
  h.dtype = dtype;
  h.shape = std::move(shape);
  h.bytes = *engine::ShapeBytes(h.shape, dtype);
  return h;
}

Bytes Encode(const TensorHeader& h) {
  Bytes b;
  b.fill(0xAA);  // EncodeTensorHeader must write every byte.
  EncodeTensorHeader(h, b.data());
  return b;
}

absl::StatusOr<TensorHeader> Decode(const Bytes& b, uint64_t max = kMax) {
  return DecodeTensorHeader(b.data(), kJob, max);
}

void Put32(Bytes* b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*b)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(Bytes* b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*b)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

TEST(TensorHeaderTest, RoundTripsEveryDTypeKindAndRank) {
  const TensorKind kinds[] = {TensorKind::kActivation, TensorKind::kGradient,
                              TensorKind::kPartialSum,
                              TensorKind::kEvalActivation};
  int checked = 0;
  for (int d = 0; d < kNumDTypes; ++d) {
    const auto dtype = static_cast<engine::DType>(d);
    for (int ndim = 0; ndim <= kMaxTensorHeaderDims; ++ndim) {
      // Distinct dims (2, 3, 1, 2, ...) so a swapped or dropped one shows.
      engine::Shape shape;
      for (int i = 0; i < ndim; ++i) shape.push_back(1 + (i + 1) % 3);
      TensorHeader h = Header(shape, dtype, kinds[(d + ndim) % 4]);
      h.tag.step = d * 100 + ndim;
      h.tag.microbatch = ndim;
      h.tag.stage = d;
      absl::StatusOr<TensorHeader> back = Decode(Encode(h));
      ASSERT_TRUE(back.ok()) << engine::DTypeName(dtype) << " ndim " << ndim
                             << ": " << back.status();
      EXPECT_EQ(*back, h) << engine::DTypeName(dtype) << " ndim " << ndim;
      ++checked;
    }
  }
  EXPECT_EQ(checked, kNumDTypes * (kMaxTensorHeaderDims + 1));
}

TEST(TensorHeaderTest, ScalarAndEmptyShapesRoundTrip) {
  for (const engine::Shape& shape :
       {engine::Shape{}, engine::Shape{0}, engine::Shape{4, 0, 2}}) {
    const TensorHeader h = Header(shape, engine::DType::kI64);
    absl::StatusOr<TensorHeader> back = Decode(Encode(h));
    ASSERT_TRUE(back.ok()) << engine::ShapeString(shape) << ": "
                           << back.status();
    EXPECT_EQ(back->shape, shape);
    EXPECT_EQ(back->bytes, shape.empty() ? 8u : 0u);
  }
}

// Pins every field's offset and byte order: multi-byte values whose bytes
// all differ, so a field moved or byte-swapped changes the image.
TEST(TensorHeaderTest, EncodesTheDocumentedLayout) {
  TensorHeader h;
  h.tag = {.job = 0xDEAD,  // Not on the wire.
           .step = 0x0102030405060708,
           .microbatch = 0x0A0B0C0D,
           .stage = 0x11121314,
           .kind = TensorKind::kGradient};
  h.dtype = engine::DType::kBF16;
  h.shape = {0x0102, 5};
  h.bytes = 0x0102 * 5 * 2;  // 2580 = 0x0A14.
  Bytes want{};
  const uint8_t head[] = {
      0x01, 0x03, 0x02, 0x00,                          // kind, dtype, ndim, 0
      0x0D, 0x0C, 0x0B, 0x0A,                          // 4: microbatch
      0x14, 0x13, 0x12, 0x11,                          // 8: stage
      0x00, 0x00, 0x00, 0x00,                          // 12: reserved
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // 16: step
      0x14, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // 24: bytes
      0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // 32: dims[0]
      0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // 40: dims[1]
  };  // 48..95: unused dims, zero.
  std::memcpy(want.data(), head, sizeof(head));
  EXPECT_EQ(Encode(h), want);

  absl::StatusOr<TensorHeader> back = DecodeTensorHeader(want.data(), 9, kMax);
  ASSERT_TRUE(back.ok()) << back.status();
  h.tag.job = 9;  // The job comes from the caller.
  EXPECT_EQ(*back, h);
}

TEST(TensorHeaderTest, JobIsNotEncodedButSuppliedByTheCaller) {
  TensorHeader a = Header({2, 3});
  TensorHeader b = a;
  b.tag.job = kJob + 100;
  EXPECT_EQ(Encode(a), Encode(b));
  absl::StatusOr<TensorHeader> back =
      DecodeTensorHeader(Encode(a).data(), 42, kMax);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tag.job, 42u);
}

// One case per rule of DecodeTensorHeader, each on an otherwise valid
// header: F32 [2, 3] (24 bytes), step 5, microbatch 3, stage 1.
TEST(TensorHeaderTest, RejectsEachBrokenRule) {
  const Bytes good = Encode(Header({2, 3}));
  ASSERT_TRUE(Decode(good).ok());
  struct Case {
    const char* what;
    std::function<void(Bytes*)> corrupt;
    const char* message;
  };
  const Case cases[] = {
      {"kind", [](Bytes* b) { (*b)[0] = 4; }, "unknown tensor kind 4"},
      {"dtype", [](Bytes* b) { (*b)[1] = kNumDTypes; }, "unknown dtype 13"},
      {"ndim", [](Bytes* b) { (*b)[2] = 9; }, "9 dimensions, at most 8"},
      {"reserved u8", [](Bytes* b) { (*b)[3] = 1; },
       "reserved bytes of a tensor header are not zero"},
      {"reserved u32", [](Bytes* b) { (*b)[15] = 0x80; },
       "reserved bytes of a tensor header are not zero"},
      {"negative microbatch", [](Bytes* b) { Put32(b, 4, ~uint32_t{0}); },
       "negative tag field (step 5, microbatch -1, stage 1)"},
      {"negative stage", [](Bytes* b) { Put32(b, 8, ~uint32_t{0}); },
       "negative tag field (step 5, microbatch 3, stage -1)"},
      {"negative step", [](Bytes* b) { Put64(b, 16, ~uint64_t{0}); },
       "negative tag field (step -1, microbatch 3, stage 1)"},
      {"byte count", [](Bytes* b) { Put64(b, 24, 25); },
       "F32[2, 3] needs 24 bytes but the header announces 25"},
      {"negative dim", [](Bytes* b) { Put64(b, 32, uint64_t(-2)); },
       "negative dimension -2"},
      {"first unused dim", [](Bytes* b) { Put64(b, 48, 1); },
       "unused dimension 2 set"},
      {"last unused dim", [](Bytes* b) { (*b)[95] = 1; },
       "unused dimension 7 set"},
      {"byte size overflow",
       [](Bytes* b) {
         Put64(b, 32, uint64_t{1} << 40);
         Put64(b, 40, uint64_t{1} << 40);
       },
       "overflows"},
      // 2^62 F32 elements: the count fits in 64 bits, the bytes do not.
      {"bytes overflow, count not",
       [](Bytes* b) { Put64(b, 32, uint64_t{1} << 62); }, "overflows"},
  };
  for (const Case& c : cases) {
    Bytes b = good;
    c.corrupt(&b);
    absl::Status s = Decode(b).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.what << ": " << s;
  }
}

TEST(TensorHeaderTest, AcceptsTheLastDTypeAndKind) {
  const TensorHeader h =
      Header({3}, engine::DType::kBool, TensorKind::kEvalActivation);
  const Bytes b = Encode(h);
  EXPECT_EQ(b[0], 3);               // kEvalActivation
  EXPECT_EQ(b[1], kNumDTypes - 1);  // kBool
  absl::StatusOr<TensorHeader> back = Decode(b);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, h);
}

TEST(TensorHeaderTest, BoundsBytesByTheCallersLimit) {
  const Bytes b = Encode(Header({1024}));  // 4096 bytes.
  EXPECT_TRUE(Decode(b, 4096).ok());
  absl::Status s = Decode(b, 4095).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("the gradient of stage 1, step 5, microbatch 3 (job 7) "
                        "has 4096 bytes, which exceeds the limit of 4095"));
}

// Encoding does not validate (tests build bad headers with it), but what it
// writes for an unsendable header is refused by the decoder, never read as
// a different, valid one.
TEST(TensorHeaderTest, TooManyDimsEncodeToARejectedHeader) {
  TensorHeader h = Header({1, 1, 1, 1, 1, 1, 1, 1, 2});
  EXPECT_THAT(Decode(Encode(h)).status().message(),
              HasSubstr("9 dimensions, at most 8"));
  h.shape.assign(256, 1);  // ndim saturates at 255 instead of wrapping to 0.
  const Bytes b = Encode(h);
  EXPECT_EQ(b[2], 255);
  EXPECT_THAT(Decode(b).status().message(), HasSubstr("255 dimensions"));
}

TEST(TensorHeaderTest, MakeTensorHeaderDescribesTheTensor) {
  absl::StatusOr<engine::Tensor> t =
      engine::CpuBackend::Get()->Empty({3, 5}, engine::DType::kI32);
  ASSERT_TRUE(t.ok());
  const Tag tag{.job = kJob,
                .step = 1,
                .microbatch = 2,
                .stage = 0,
                .kind = TensorKind::kActivation};
  absl::StatusOr<TensorHeader> h = MakeTensorHeader(tag, *t);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tag, tag);
  EXPECT_EQ(h->dtype, engine::DType::kI32);
  EXPECT_EQ(h->shape, (engine::Shape{3, 5}));
  EXPECT_EQ(h->bytes, 60u);
}

TEST(TensorHeaderTest, MakeTensorHeaderRejectsWhatCannotBeSent) {
  engine::CpuBackend* cpu = engine::CpuBackend::Get();
  const Tag tag{.job = kJob,
                .step = 1,
                .microbatch = 2,
                .stage = 0,
                .kind = TensorKind::kActivation};
  absl::Status undefined = MakeTensorHeader(tag, engine::Tensor()).status();
  EXPECT_EQ(undefined.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(undefined.message(), HasSubstr("is an undefined tensor"));

  absl::StatusOr<engine::Tensor> t = cpu->Empty({2}, engine::DType::kF32);
  ASSERT_TRUE(t.ok());
  Tag negative_step = tag, negative_microbatch = tag, negative_stage = tag;
  negative_step.step = -1;
  negative_microbatch.microbatch = -1;
  negative_stage.stage = -1;
  for (const Tag& negative :
       {negative_step, negative_microbatch, negative_stage}) {
    absl::Status s = MakeTensorHeader(negative, *t).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
        << ToString(negative);
    EXPECT_THAT(s.message(), HasSubstr("negative field in the tag"))
        << ToString(negative);
  }

  absl::StatusOr<engine::Tensor> eight =
      cpu->Empty({1, 1, 1, 1, 1, 1, 1, 2}, engine::DType::kF32);
  ASSERT_TRUE(eight.ok());
  EXPECT_TRUE(MakeTensorHeader(tag, *eight).ok());
  absl::StatusOr<engine::Tensor> nine =
      cpu->Empty({1, 1, 1, 1, 1, 1, 1, 1, 2}, engine::DType::kF32);
  ASSERT_TRUE(nine.ok());
  EXPECT_THAT(MakeTensorHeader(tag, *nine).status().message(),
              HasSubstr("has 9 dimensions; at most 8 can be sent"));
}

}  // namespace
}  // namespace conveyor::transport
