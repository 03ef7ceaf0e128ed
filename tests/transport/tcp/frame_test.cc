#include "transport/tcp/frame.h"

#include <cstring>

#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::transport {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kJob = 7;
constexpr uint64_t kMax = 1 << 20;

Tag T(int64_t step, int32_t mb, int32_t stage,
      TensorKind kind = TensorKind::kActivation) {
  return {.job = kJob,
          .step = step,
          .microbatch = mb,
          .stage = stage,
          .kind = kind};
}

FrameHeaderBytes Encode(const FrameHeader& h) {
  FrameHeaderBytes bytes;
  EncodeFrameHeader(h, &bytes);
  return bytes;
}

FrameHeader ValidHeader() {
  engine::Tensor t =
      *engine::CpuBackend::Get()->Empty({2, 3}, engine::DType::kF32);
  return *TensorFrameHeader(T(5, 3, 1, TensorKind::kGradient), t);
}

void PutU64(FrameHeaderBytes* b, size_t offset, uint64_t v) {
  std::memcpy(b->data() + offset, &v, 8);  // Tests run little-endian.
}

TEST(FrameTest, TensorHeaderRoundTrips) {
  const FrameHeader h = ValidHeader();
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(Encode(h), kJob, kMax);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, FrameKind::kGradient);
  EXPECT_EQ(got->dtype, engine::DType::kF32);
  EXPECT_EQ(got->shape, (engine::Shape{2, 3}));
  EXPECT_EQ(got->payload_bytes, 24u);
  EXPECT_EQ(TagOf(*got), T(5, 3, 1, TensorKind::kGradient));
}

// The gradient-norm reduction's partial sums travel with a kind of their
// own (frame kind 5, not the TensorKind's value 2, which is the abort
// frame's), so they round-trip as partial sums and are named as such: a
// stalled reduction was once reported as the "activation of stage 2".
TEST(FrameTest, PartialSumsRoundTripAndAreNamedAsSuch) {
  engine::Tensor t =
      *engine::CpuBackend::Get()->Empty({1}, engine::DType::kF64);
  const Tag tag = T(5, 0, 1, TensorKind::kPartialSum);
  absl::StatusOr<FrameHeader> h = TensorFrameHeader(tag, t);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->kind, FrameKind::kPartialSum);
  const FrameHeaderBytes bytes = Encode(*h);
  EXPECT_EQ(bytes[6], 5);
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(bytes, kJob, kMax);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(TagOf(*got), tag);
  EXPECT_EQ(ToString(tag),
            "gradient-norm partial sum of rank 1, step 5 (job 7)");
  EXPECT_EQ(ToString(T(5, 3, 2)),
            "activation of stage 2, step 5, microbatch 3 (job 7)");
}

TEST(FrameTest, LayoutIsLittleEndianAtDocumentedOffsets) {
  const FrameHeaderBytes b = Encode(ValidHeader());
  EXPECT_EQ(b[0], 'C');
  EXPECT_EQ(b[3], 'F');
  EXPECT_EQ(b[4], kWireVersion);
  EXPECT_EQ(b[6], 1);   // kind: gradient
  EXPECT_EQ(b[8], 2);   // ndim
  EXPECT_EQ(b[12], 3);  // microbatch
  EXPECT_EQ(b[16], 1);  // stage
  EXPECT_EQ(b[24], kJob);
  EXPECT_EQ(b[32], 5);   // step
  EXPECT_EQ(b[40], 24);  // payload bytes
  EXPECT_EQ(b[48], 2);
  EXPECT_EQ(b[56], 3);
}

TEST(FrameTest, ScalarAndEmptyTensorsAreConsistent) {
  auto* cpu = engine::CpuBackend::Get();
  for (const engine::Shape& shape :
       {engine::Shape{}, engine::Shape{0}, engine::Shape{4, 0, 2}}) {
    engine::Tensor t = *cpu->Empty(shape, engine::DType::kI64);
    absl::StatusOr<FrameHeader> h = TensorFrameHeader(T(0, 0, 0), t);
    ASSERT_TRUE(h.ok());
    absl::StatusOr<FrameHeader> got = DecodeFrameHeader(Encode(*h), kJob, kMax);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->shape, shape);
    EXPECT_EQ(got->payload_bytes, t.bytes());
  }
}

TEST(FrameTest, RejectsWrongMagicAsDataLoss) {
  FrameHeaderBytes b = Encode(ValidHeader());
  b[0] = 'X';
  EXPECT_EQ(DecodeFrameHeader(b, kJob, kMax).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(FrameTest, RejectsOtherVersionAndJob) {
  FrameHeaderBytes b = Encode(ValidHeader());
  b[4] = kWireVersion + 1;
  EXPECT_THAT(DecodeFrameHeader(b, kJob, kMax).status().message(),
              HasSubstr("protocol version 2"));
  EXPECT_EQ(
      DecodeFrameHeader(Encode(ValidHeader()), kJob + 1, kMax).status().code(),
      absl::StatusCode::kFailedPrecondition);
}

// Each corruption must be caught by the header check, before a reader would
// allocate or read a payload.
TEST(FrameTest, RejectsInconsistentFields) {
  struct Case {
    const char* name;
    void (*corrupt)(FrameHeaderBytes*);
    const char* message;
  };
  const Case cases[] = {
      {"kind", [](FrameHeaderBytes* b) { (*b)[6] = 9; }, "unknown kind 9"},
      {"dtype", [](FrameHeaderBytes* b) { (*b)[7] = 200; }, "unknown dtype"},
      {"ndim", [](FrameHeaderBytes* b) { (*b)[8] = 9; }, "9 dimensions"},
      {"reserved", [](FrameHeaderBytes* b) { (*b)[10] = 1; }, "reserved"},
      {"negative dim", [](FrameHeaderBytes* b) { PutU64(b, 48, uint64_t(-2)); },
       "negative dimension"},
      {"unused dim", [](FrameHeaderBytes* b) { PutU64(b, 64, 1); },
       "unused dimension 2"},
      {"negative step",
       [](FrameHeaderBytes* b) { PutU64(b, 32, uint64_t(-1)); },
       "negative tag field"},
      {"byte count", [](FrameHeaderBytes* b) { PutU64(b, 40, 25); },
       "needs 24 bytes but the frame announces 25"},
      {"overflow",
       [](FrameHeaderBytes* b) {
         PutU64(b, 48, uint64_t{1} << 40);
         PutU64(b, 56, uint64_t{1} << 40);
       },
       "overflows"},
      {"status on tensor", [](FrameHeaderBytes* b) { (*b)[20] = 3; },
       "status code on a tensor frame"},
  };
  for (const Case& c : cases) {
    FrameHeaderBytes b = Encode(ValidHeader());
    c.corrupt(&b);
    absl::Status s = DecodeFrameHeader(b, kJob, kMax).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.name;
  }
}

TEST(FrameTest, RejectsConsistentButOversizedPayload) {
  FrameHeader h = ValidHeader();
  h.shape = {1 << 20, 1 << 10};  // 4 GiB of f32, consistent with payload.
  h.payload_bytes = uint64_t{4} << 30;
  absl::Status s = DecodeFrameHeader(Encode(h), kJob, kMax).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("exceeds the limit of 1048576"));
}

TEST(FrameTest, AbortFrameCarriesCodeAndBoundedMessage) {
  const absl::Status status =
      absl::DeadlineExceededError(std::string(10000, 'x'));
  const FrameHeader h = AbortFrameHeader(kJob, status);
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(Encode(h), kJob, kMax);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, FrameKind::kAbort);
  EXPECT_EQ(got->status_code,
            static_cast<uint32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(got->payload_bytes, kMaxAbortMessageBytes);
  EXPECT_EQ(AbortPayload(status).size(), kMaxAbortMessageBytes);

  FrameHeaderBytes b = Encode(h);
  b[20] = 0;  // An abort must carry an error code.
  EXPECT_EQ(DecodeFrameHeader(b, kJob, kMax).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FrameTest, GoodbyeRoundTripsAndMustBeEmpty) {
  FrameHeader h = GoodbyeFrameHeader(kJob);
  ASSERT_TRUE(DecodeFrameHeader(Encode(h), kJob, kMax).ok());
  h.shape = {3};
  h.payload_bytes = 3;
  EXPECT_THAT(DecodeFrameHeader(Encode(h), kJob, kMax).status().message(),
              HasSubstr("goodbye frame with a payload"));
}

TEST(FrameTest, MessageFramesAreBoundedU8) {
  FrameHeader h = MessageFrameHeader(kJob, 300);
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(Encode(h), kJob, kMax);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, FrameKind::kMessage);
  EXPECT_EQ(got->payload_bytes, 300u);

  // Bounded by kMaxMessageBytes, not by the (larger) tensor limit.
  h = MessageFrameHeader(kJob, kMaxMessageBytes + 1);
  EXPECT_THAT(DecodeFrameHeader(Encode(h), kJob, kMax).status().message(),
              HasSubstr("message frame is not a U8 message"));
  h = MessageFrameHeader(kJob, 8);
  h.dtype = engine::DType::kF32;
  h.shape = {2};
  EXPECT_EQ(DecodeFrameHeader(Encode(h), kJob, kMax).status().code(),
            absl::StatusCode::kInvalidArgument);
  h = MessageFrameHeader(kJob, 8);
  h.status_code = 2;
  EXPECT_EQ(DecodeFrameHeader(Encode(h), kJob, kMax).status().code(),
            absl::StatusCode::kInvalidArgument);
  FrameHeaderBytes b = Encode(MessageFrameHeader(kJob, 8));
  b[6] = 6;  // The next kind is unknown.
  EXPECT_THAT(DecodeFrameHeader(b, kJob, kMax).status().message(),
              HasSubstr("unknown kind 6"));
}

TEST(FrameTest, TensorFrameHeaderRejectsWhatCannotBeSent) {
  auto* cpu = engine::CpuBackend::Get();
  engine::Tensor nine_dims =
      *cpu->Empty({1, 1, 1, 1, 1, 1, 1, 1, 1}, engine::DType::kF32);
  EXPECT_THAT(TensorFrameHeader(T(0, 0, 0), nine_dims).status().message(),
              HasSubstr("9 dimensions"));
  engine::Tensor t = *cpu->Empty({1}, engine::DType::kF32);
  EXPECT_EQ(TensorFrameHeader(T(0, -1, 0), t).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FrameTest, HelloRoundTripsAndRejectsGarbage) {
  HelloBytes b;
  EncodeHello({.from_rank = 2, .to_rank = 1, .job = kJob, .secret = "s3cret"},
              &b);
  absl::StatusOr<Hello> hello = DecodeHello(b);
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->version, kWireVersion);
  EXPECT_EQ(hello->from_rank, 2);
  EXPECT_EQ(hello->to_rank, 1);
  EXPECT_EQ(hello->job, kJob);
  EXPECT_EQ(hello->secret, "s3cret");

  b[6] = 65;  // Secret length beyond the field.
  EXPECT_EQ(DecodeHello(b).status().code(), absl::StatusCode::kDataLoss);
  b.fill('G');
  EXPECT_EQ(DecodeHello(b).status().code(), absl::StatusCode::kDataLoss);
}

TEST(FrameTest, HelloAckRoundTrips) {
  HelloAckBytes b;
  EncodeHelloAck(HelloResult::kBadSecret, &b);
  EXPECT_EQ(*DecodeHelloAck(b), HelloResult::kBadSecret);
  b[6] = 99;
  EXPECT_EQ(DecodeHelloAck(b).status().code(), absl::StatusCode::kDataLoss);
}

TEST(FrameTest, ConstantTimeEqualsComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

}  // namespace
}  // namespace conveyor::transport
