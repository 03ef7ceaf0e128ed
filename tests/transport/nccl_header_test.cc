#include <cstring>
#include <functional>
#include <string>

#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/nccl/header.h"

namespace conveyor::transport {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kJob = 7;
constexpr uint64_t kMax = uint64_t{1} << 30;
// Where the first tensor header starts in an encoded round.
constexpr size_t kFirstTensor = kLinkPreambleSize;

TensorHeader Header(int32_t mb, engine::Shape shape,
                    engine::DType dtype = engine::DType::kF32,
                    TensorKind kind = TensorKind::kActivation) {
  TensorHeader h;
  h.tag = {.job = kJob, .step = 3, .microbatch = mb, .stage = 1, .kind = kind};
  h.dtype = dtype;
  h.shape = shape;
  h.bytes = static_cast<uint64_t>(engine::NumElements(shape)) *
            engine::DTypeSize(dtype);
  return h;
}

LinkMessage Round(uint64_t round, std::vector<TensorHeader> tensors) {
  return RoundMessage(kJob, round, std::move(tensors));
}

// Little-endian fields of an encoded message, for corrupting it.
void Put64(std::string* s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*s)[at + i] = static_cast<char>(v >> (8 * i));
}
void Put32(std::string* s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[at + i] = static_cast<char>(v >> (8 * i));
}

TEST(NcclHeaderTest, RoundTripsARoundOfTensors) {
  const LinkMessage m = Round(
      12, {Header(0, {4, 8}),
           Header(5, {2, 3, 4}, engine::DType::kI64, TensorKind::kGradient),
           Header(1, {}, engine::DType::kBF16), Header(2, {0, 16}),
           Header(6, {1}, engine::DType::kF64, TensorKind::kPartialSum),
           Header(3, {1, 1, 1, 1, 1, 1, 1, 2}, engine::DType::kU8)});
  const std::string bytes = EncodeLinkMessage(m);
  EXPECT_EQ(bytes.size(), kLinkPreambleSize + 6 * kTensorHeaderSize);
  absl::StatusOr<LinkMessage> back = DecodeLinkMessage(bytes, kJob, kMax);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, LinkMessageKind::kRound);
  EXPECT_EQ(back->job, kJob);
  EXPECT_EQ(back->round, 12u);
  EXPECT_EQ(back->tensors, m.tensors);
}

TEST(NcclHeaderTest, RoundTripsAnEmptyRound) {
  absl::StatusOr<LinkMessage> back =
      DecodeLinkMessage(EncodeLinkMessage(Round(0, {})), kJob, kMax);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->round, 0u);
  EXPECT_TRUE(back->tensors.empty());
}

TEST(NcclHeaderTest, RoundTripsAbortAndGoodbye) {
  absl::StatusOr<LinkMessage> abort =
      DecodeLinkMessage(EncodeLinkMessage(AbortMessage(
                            kJob, absl::UnavailableError("rank 2 lost"))),
                        kJob, kMax);
  ASSERT_TRUE(abort.ok()) << abort.status();
  EXPECT_EQ(abort->kind, LinkMessageKind::kAbort);
  EXPECT_EQ(abort->status, absl::UnavailableError("rank 2 lost"));

  absl::StatusOr<LinkMessage> goodbye = DecodeLinkMessage(
      EncodeLinkMessage(GoodbyeMessage(kJob, 41)), kJob, kMax);
  ASSERT_TRUE(goodbye.ok()) << goodbye.status();
  EXPECT_EQ(goodbye->kind, LinkMessageKind::kGoodbye);
  EXPECT_EQ(goodbye->round, 41u);
}

TEST(NcclHeaderTest, TruncatesLongAbortMessages) {
  const std::string long_message(3 * kMaxLinkAbortMessageBytes, 'x');
  absl::StatusOr<LinkMessage> back = DecodeLinkMessage(
      EncodeLinkMessage(AbortMessage(kJob, absl::InternalError(long_message))),
      kJob, kMax);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->status.message().size(), kMaxLinkAbortMessageBytes);
}

TEST(NcclHeaderTest, MakeTensorHeaderDescribesTheTensor) {
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

TEST(NcclHeaderTest, MakeTensorHeaderRejectsWhatCannotBeSent) {
  engine::CpuBackend* cpu = engine::CpuBackend::Get();
  const Tag tag{.job = kJob,
                .step = 1,
                .microbatch = 2,
                .stage = 0,
                .kind = TensorKind::kActivation};
  EXPECT_EQ(MakeTensorHeader(tag, engine::Tensor()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<engine::Tensor> t = cpu->Empty({2}, engine::DType::kF32);
  ASSERT_TRUE(t.ok());
  Tag negative = tag;
  negative.microbatch = -1;
  EXPECT_THAT(MakeTensorHeader(negative, *t).status().message(),
              HasSubstr("negative"));
  absl::StatusOr<engine::Tensor> nine =
      cpu->Empty({1, 1, 1, 1, 1, 1, 1, 1, 2}, engine::DType::kF32);
  ASSERT_TRUE(nine.ok());
  EXPECT_THAT(MakeTensorHeader(tag, *nine).status().message(),
              HasSubstr("9 dimensions"));
}

// One check per rule of DecodeLinkMessage, each on an otherwise valid
// message with one tensor header (which starts at byte 32).
TEST(NcclHeaderTest, RejectsMalformedMessages) {
  const std::string good = EncodeLinkMessage(Round(4, {Header(0, {2, 3})}));
  ASSERT_TRUE(DecodeLinkMessage(good, kJob, kMax).ok());
  struct Case {
    const char* what;
    std::function<void(std::string*)> corrupt;
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"short", [](std::string* s) { s->resize(10); },
       absl::StatusCode::kDataLoss, "shorter"},
      {"magic", [](std::string* s) { (*s)[0] = 'X'; },
       absl::StatusCode::kDataLoss, "magic"},
      {"version", [](std::string* s) { (*s)[4] = 9; },
       absl::StatusCode::kFailedPrecondition, "version 9"},
      {"job", [](std::string* s) { Put64(s, 8, 8); },
       absl::StatusCode::kFailedPrecondition, "job 8, expected 7"},
      {"kind", [](std::string* s) { (*s)[6] = 3; },
       absl::StatusCode::kInvalidArgument, "unknown kind 3"},
      {"reserved", [](std::string* s) { (*s)[7] = 1; },
       absl::StatusCode::kInvalidArgument, "reserved"},
      {"count", [](std::string* s) { Put32(s, 24, 2); },
       absl::StatusCode::kInvalidArgument, "a round of 2 tensors"},
      {"trailing", [](std::string* s) { s->push_back('\0'); },
       absl::StatusCode::kInvalidArgument, "bytes of headers"},
      {"tensor kind", [](std::string* s) { (*s)[kFirstTensor] = 3; },
       absl::StatusCode::kInvalidArgument, "unknown tensor kind"},
      {"dtype", [](std::string* s) { (*s)[kFirstTensor + 1] = 100; },
       absl::StatusCode::kInvalidArgument, "unknown dtype"},
      {"ndim", [](std::string* s) { (*s)[kFirstTensor + 2] = 9; },
       absl::StatusCode::kInvalidArgument, "9 dimensions"},
      {"tensor reserved", [](std::string* s) { (*s)[kFirstTensor + 12] = 1; },
       absl::StatusCode::kInvalidArgument, "reserved"},
      {"negative step",
       [](std::string* s) { Put64(s, kFirstTensor + 16, ~uint64_t{0}); },
       absl::StatusCode::kInvalidArgument, "negative tag field"},
      {"negative dim",
       [](std::string* s) { Put64(s, kFirstTensor + 32, ~uint64_t{0}); },
       absl::StatusCode::kInvalidArgument, "negative dimension"},
      {"unused dim",
       [](std::string* s) { Put64(s, kFirstTensor + 32 + 8 * 5, 1); },
       absl::StatusCode::kInvalidArgument, "unused dimension 5"},
      {"bytes", [](std::string* s) { Put64(s, kFirstTensor + 24, 25); },
       absl::StatusCode::kInvalidArgument, "needs 24 bytes"},
      {"overflow",
       [](std::string* s) {
         Put64(s, kFirstTensor + 32, uint64_t{1} << 40);
         Put64(s, kFirstTensor + 40, uint64_t{1} << 40);
       },
       absl::StatusCode::kInvalidArgument, "overflows"},
  };
  for (const Case& c : cases) {
    std::string bytes = good;
    c.corrupt(&bytes);
    absl::StatusOr<LinkMessage> m = DecodeLinkMessage(bytes, kJob, kMax);
    EXPECT_EQ(m.status().code(), c.code) << c.what << ": " << m.status();
    EXPECT_THAT(m.status().message(), HasSubstr(c.message)) << c.what;
  }
}

TEST(NcclHeaderTest, RejectsTensorsOverTheLimit) {
  const std::string bytes = EncodeLinkMessage(Round(0, {Header(0, {1024})}));
  EXPECT_TRUE(DecodeLinkMessage(bytes, kJob, 4096).ok());
  absl::StatusOr<LinkMessage> m = DecodeLinkMessage(bytes, kJob, 4095);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("more than the limit of 4095"));
}

TEST(NcclHeaderTest, RejectsMalformedAbortsAndGoodbyes) {
  std::string abort =
      EncodeLinkMessage(AbortMessage(kJob, absl::InternalError("x")));
  std::string zero_code = abort;
  Put32(&zero_code, 24, 0);
  EXPECT_THAT(DecodeLinkMessage(zero_code, kJob, kMax).status().message(),
              HasSubstr("status code 0"));
  std::string unknown_code = abort;
  Put32(&unknown_code, 24, 99);
  EXPECT_THAT(DecodeLinkMessage(unknown_code, kJob, kMax).status().message(),
              HasSubstr("status code 99"));
  std::string too_long = abort + std::string(kMaxLinkAbortMessageBytes, 'y');
  EXPECT_THAT(DecodeLinkMessage(too_long, kJob, kMax).status().message(),
              HasSubstr("at most 4096"));

  std::string goodbye = EncodeLinkMessage(GoodbyeMessage(kJob, 2));
  EXPECT_THAT(DecodeLinkMessage(goodbye + "z", kJob, kMax).status().message(),
              HasSubstr("goodbye with a body"));
}

}  // namespace
}  // namespace conveyor::transport
