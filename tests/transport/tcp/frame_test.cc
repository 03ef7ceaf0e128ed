#include "transport/tcp/frame.h"

#include <array>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::transport {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kJob = 7;
constexpr uint64_t kMax = 1 << 20;
// Where the tensor header starts in a frame header, as frame.h documents.
constexpr size_t kPreamble = 24;
static_assert(kPreamble == kFramePreambleSize);

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
  for (int i = 0; i < 8; ++i) {
    (*b)[offset + i] = static_cast<uint8_t>(v >> (8 * i));
  }
}

TEST(FrameTest, TensorFrameRoundTrips) {
  const FrameHeader h = ValidHeader();
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(Encode(h), kJob, kMax);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, FrameKind::kGradient);
  EXPECT_EQ(got->dtype, engine::DType::kF32);
  EXPECT_EQ(got->shape, (engine::Shape{2, 3}));
  EXPECT_EQ(got->payload_bytes, 24u);
  EXPECT_EQ(got->status_code, 0u);
  EXPECT_EQ(TagOf(*got), T(5, 3, 1, TensorKind::kGradient));
}

// The gradient-norm reduction's partial sums travel with a frame kind of
// their own (5, not the TensorKind's value 2, which is the abort frame's),
// while the embedded tensor header carries the TensorKind (2), so they
// round-trip as partial sums and are named as such: a stalled reduction was
// once reported as the "activation of stage 2".
TEST(FrameTest, PartialSumsRoundTripAndAreNamedAsSuch) {
  engine::Tensor t =
      *engine::CpuBackend::Get()->Empty({1}, engine::DType::kF64);
  const Tag tag = T(5, 0, 1, TensorKind::kPartialSum);
  absl::StatusOr<FrameHeader> h = TensorFrameHeader(tag, t);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->kind, FrameKind::kPartialSum);
  const FrameHeaderBytes bytes = Encode(*h);
  EXPECT_EQ(bytes[6], 5);
  EXPECT_EQ(bytes[kPreamble], 2);
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(bytes, kJob, kMax);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(TagOf(*got), tag);
  EXPECT_EQ(ToString(tag),
            "gradient-norm partial sum of rank 1, step 5 (job 7)");
  EXPECT_EQ(ToString(T(5, 3, 2)),
            "activation of stage 2, step 5, microbatch 3 (job 7)");
}

// An evaluation's activations have a frame kind (6) and a tensor kind (3) of
// their own, so they are never taken for the next training step's, and are
// named as what they are.
TEST(FrameTest, EvaluationActivationsRoundTripAndAreNamedAsSuch) {
  engine::Tensor t =
      *engine::CpuBackend::Get()->Empty({2, 3}, engine::DType::kF32);
  const Tag tag = T(5, 7, 1, TensorKind::kEvalActivation);
  absl::StatusOr<FrameHeader> h = TensorFrameHeader(tag, t);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->kind, FrameKind::kEvalActivation);
  const FrameHeaderBytes bytes = Encode(*h);
  EXPECT_EQ(bytes[6], 6);
  EXPECT_EQ(bytes[kPreamble], 3);
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(bytes, kJob, kMax);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(TagOf(*got), tag);
  EXPECT_NE(TagOf(*got), T(5, 7, 1));
  EXPECT_EQ(ToString(tag),
            "evaluation activation of stage 1 after step 5, microbatch 7 "
            "(job 7)");
  // A training frame kind with an evaluation's tensor header is refused.
  FrameHeaderBytes mixed = bytes;
  mixed[6] = 0;
  EXPECT_THAT(DecodeFrameHeader(mixed, kJob, kMax).status().message(),
              HasSubstr("activation frame with a tensor header of kind 3"));
}

// The preamble byte for byte, then the tensor header: exactly the shared
// encoding (tests/transport/tensor_header_test.cc pins its own layout), at
// the frame offsets frame.h documents.
TEST(FrameTest, LayoutIsPreambleThenTheSharedTensorHeader) {
  const FrameHeader h =
      AbortFrameHeader(0x0102030405060708, absl::DeadlineExceededError("x"));
  const FrameHeaderBytes b = Encode(h);
  const uint8_t preamble[kPreamble] = {
      'C',  'V',  'Y',  'F',                           // magic
      0x02, 0x00,                                      // version
      0x02, 0x00,                                      // kind: abort, zero
      0x04, 0x00, 0x00, 0x00,                          // status code
      0x00, 0x00, 0x00, 0x00,                          // zero
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // job
  };
  EXPECT_EQ(std::memcmp(b.data(), preamble, kPreamble), 0);
  EXPECT_EQ(kFrameHeaderSize, kPreamble + kTensorHeaderSize);

  const FrameHeader t = ValidHeader();
  const FrameHeaderBytes tb = Encode(t);
  std::array<uint8_t, kTensorHeaderSize> block;
  EncodeTensorHeader({.tag = TagOf(t),
                      .dtype = t.dtype,
                      .shape = t.shape,
                      .bytes = t.payload_bytes},
                     block.data());
  EXPECT_EQ(std::memcmp(tb.data() + kPreamble, block.data(), block.size()), 0);
  EXPECT_EQ(tb[6], 1);    // frame kind: gradient
  EXPECT_EQ(tb[24], 1);   // tensor kind: gradient
  EXPECT_EQ(tb[25], 0);   // dtype: F32
  EXPECT_EQ(tb[26], 2);   // ndim
  EXPECT_EQ(tb[28], 3);   // microbatch
  EXPECT_EQ(tb[32], 1);   // stage
  EXPECT_EQ(tb[40], 5);   // step
  EXPECT_EQ(tb[48], 24);  // payload bytes
  EXPECT_EQ(tb[56], 2);   // dims
  EXPECT_EQ(tb[64], 3);
}

TEST(FrameTest, RejectsWrongMagicAsDataLoss) {
  FrameHeaderBytes b = Encode(ValidHeader());
  b[0] = 'X';
  absl::Status s = DecodeFrameHeader(b, kJob, kMax).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("wrong magic"));
}

// A version-1 peer (112-byte headers) is refused at the version, before the
// different layout is read as anything.
TEST(FrameTest, RejectsOtherVersionsAndJobs) {
  for (uint16_t version : {uint16_t{1}, uint16_t{kWireVersion + 1}}) {
    FrameHeaderBytes b = Encode(ValidHeader());
    b[4] = static_cast<uint8_t>(version);
    absl::Status s = DecodeFrameHeader(b, kJob, kMax).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << version;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("protocol version ",
                                                    version, ", expected 2")));
  }
  absl::Status s =
      DecodeFrameHeader(Encode(ValidHeader()), kJob + 1, kMax).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("job 7, expected 8"));
}

// The frame's own rules, and that the tensor header's are applied (one
// case: tensor_header_test.cc covers each) with the frame's prefix. Each
// corruption must be caught by the header check, before a reader would
// allocate or read a payload.
TEST(FrameTest, RejectsInconsistentFields) {
  struct Case {
    const char* name;
    void (*corrupt)(FrameHeaderBytes*);
    const char* message;
  };
  const Case cases[] = {
      {"kind", [](FrameHeaderBytes* b) { (*b)[6] = 7; },
       "bad frame header: unknown kind 7"},
      {"reserved u8", [](FrameHeaderBytes* b) { (*b)[7] = 1; },
       "bad frame header: reserved bytes are not zero"},
      {"reserved u32", [](FrameHeaderBytes* b) { (*b)[15] = 1; },
       "bad frame header: reserved bytes are not zero"},
      {"status on tensor", [](FrameHeaderBytes* b) { (*b)[8] = 3; },
       "bad frame header: status code on a tensor frame"},
      {"tensor kind", [](FrameHeaderBytes* b) { (*b)[24] = 0; },
       "bad frame header: gradient frame with a tensor header of kind 0"},
      {"tensor header", [](FrameHeaderBytes* b) { PutU64(b, 48, 25); },
       "bad frame header: F32[2, 3] needs 24 bytes but the header announces "
       "25"},
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
  EXPECT_TRUE(DecodeFrameHeader(Encode(h), kJob, h.payload_bytes).ok());
}

TEST(FrameTest, AbortFrameCarriesCodeAndBoundedMessage) {
  const absl::Status status =
      absl::DeadlineExceededError(std::string(10000, 'x'));
  const FrameHeader h = AbortFrameHeader(kJob, status);
  // Its own bound, not the (here smaller) tensor limit.
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(Encode(h), kJob, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, FrameKind::kAbort);
  EXPECT_EQ(got->status_code,
            static_cast<uint32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(got->payload_bytes, kMaxAbortMessageBytes);
  EXPECT_EQ(AbortPayload(status).size(), kMaxAbortMessageBytes);

  for (uint32_t code : {0u, 17u}) {  // OK, and one past kUnauthenticated.
    FrameHeaderBytes b = Encode(h);
    b[8] = static_cast<uint8_t>(code);
    EXPECT_THAT(DecodeFrameHeader(b, kJob, kMax).status().message(),
                HasSubstr(absl::StrCat("abort frame with status code ", code)));
  }
  FrameHeader longer = h;
  longer.shape = {kMaxAbortMessageBytes + 1};
  longer.payload_bytes = kMaxAbortMessageBytes + 1;
  FrameHeader wide = h;  // Consistent, but not a byte string.
  wide.dtype = engine::DType::kF32;
  wide.shape = {1024};
  FrameHeader square = h;
  square.shape = {64, 64};
  for (const FrameHeader& bad : {longer, wide, square}) {
    EXPECT_THAT(DecodeFrameHeader(Encode(bad), kJob, kMax).status().message(),
                HasSubstr("abort frame is not a U8 message of at most 4096 "
                          "bytes"))
        << engine::ShapeString(bad.shape);
  }
}

// Abort, goodbye and message frames describe their payload under a zero
// tag: any tag field set, or a tensor kind, is refused (a second encoding
// of the same frame otherwise).
TEST(FrameTest, NonTensorFramesHaveAZeroTag) {
  const FrameHeader frames[] = {
      AbortFrameHeader(kJob, absl::InternalError("x")),
      GoodbyeFrameHeader(kJob), MessageFrameHeader(kJob, 8)};
  for (const FrameHeader& h : frames) {
    ASSERT_TRUE(DecodeFrameHeader(Encode(h), kJob, kMax).ok());
    const size_t fields[] = {24, 28, 32, 40};  // kind, mb, stage, step
    for (size_t at : fields) {
      FrameHeaderBytes b = Encode(h);
      b[at] = 1;
      absl::Status s = DecodeFrameHeader(b, kJob, kMax).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << at;
      EXPECT_THAT(s.message(), HasSubstr("frame with a tag")) << at;
    }
  }
}

TEST(FrameTest, GoodbyeRoundTripsAndMustBeEmpty) {
  FrameHeader h = GoodbyeFrameHeader(kJob);
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(Encode(h), kJob, kMax);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, FrameKind::kGoodbye);
  EXPECT_EQ(got->payload_bytes, 0u);

  h.shape = {3};
  h.payload_bytes = 3;
  EXPECT_THAT(DecodeFrameHeader(Encode(h), kJob, kMax).status().message(),
              HasSubstr("goodbye frame with a payload"));
  h = GoodbyeFrameHeader(kJob);
  h.status_code = 1;
  EXPECT_THAT(DecodeFrameHeader(Encode(h), kJob, kMax).status().message(),
              HasSubstr("goodbye frame with a payload"));
  h = GoodbyeFrameHeader(kJob);
  h.shape = {0, 5};  // Empty, but not a byte string.
  EXPECT_THAT(DecodeFrameHeader(Encode(h), kJob, kMax).status().message(),
              HasSubstr("goodbye frame is not an empty U8 message"));
  h = GoodbyeFrameHeader(kJob);
  h.dtype = engine::DType::kF32;
  EXPECT_THAT(DecodeFrameHeader(Encode(h), kJob, kMax).status().message(),
              HasSubstr("goodbye frame is not an empty U8 message"));
}

TEST(FrameTest, MessageFramesAreBoundedU8) {
  FrameHeader h = MessageFrameHeader(kJob, 300);
  // Bounded by kMaxMessageBytes, not by the (here smaller) tensor limit.
  absl::StatusOr<FrameHeader> got = DecodeFrameHeader(Encode(h), kJob, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, FrameKind::kMessage);
  EXPECT_EQ(got->payload_bytes, 300u);
  EXPECT_TRUE(
      DecodeFrameHeader(Encode(MessageFrameHeader(kJob, kMaxMessageBytes)),
                        kJob, kMax)
          .ok());

  FrameHeader longer = MessageFrameHeader(kJob, kMaxMessageBytes + 1);
  FrameHeader wide = MessageFrameHeader(kJob, 8);
  wide.dtype = engine::DType::kF32;
  wide.shape = {2};
  FrameHeader square = MessageFrameHeader(kJob, 8);
  square.shape = {2, 4};
  FrameHeader with_status = MessageFrameHeader(kJob, 8);
  with_status.status_code = 2;
  for (const FrameHeader& bad : {longer, wide, square, with_status}) {
    absl::Status s = DecodeFrameHeader(Encode(bad), kJob, kMax).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(),
                HasSubstr("message frame is not a U8 message of at most 65536 "
                          "bytes"));
  }
}

// MakeTensorHeader's checks (tensor_header_test.cc has each), at Send.
TEST(FrameTest, TensorFrameHeaderRejectsWhatCannotBeSent) {
  auto* cpu = engine::CpuBackend::Get();
  engine::Tensor nine_dims =
      *cpu->Empty({1, 1, 1, 1, 1, 1, 1, 1, 1}, engine::DType::kF32);
  EXPECT_THAT(TensorFrameHeader(T(0, 0, 0), nine_dims).status().message(),
              HasSubstr("9 dimensions"));
  engine::Tensor t = *cpu->Empty({1}, engine::DType::kF32);
  absl::Status s = TensorFrameHeader(T(0, -1, 0), t).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("negative field in the tag"));
  EXPECT_EQ(TensorFrameHeader(T(0, 0, 0), engine::Tensor()).status().code(),
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
