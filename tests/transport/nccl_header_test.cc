#include <array>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

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

// The round's wire image: the preamble byte for byte, then each tensor
// header in the shared encoding (transport/tensor_header.h), in order.
TEST(NcclHeaderTest, RoundIsPreambleThenSharedTensorHeaders) {
  const std::vector<TensorHeader> tensors = {
      Header(0, {4, 8}), Header(9, {3}, engine::DType::kU8)};
  const std::string bytes =
      EncodeLinkMessage(RoundMessage(0x0102030405060708, 0x1112, tensors));
  ASSERT_EQ(bytes.size(), kLinkPreambleSize + 2 * kTensorHeaderSize);
  const uint8_t preamble[kLinkPreambleSize] = {
      'C',  'V',  'Y',  'N',                           // magic
      0x01, 0x00,                                      // version
      0x00, 0x00,                                      // kind: round, zero
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // job
      0x12, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // round
      0x02, 0x00, 0x00, 0x00,                          // count
      0x00, 0x00, 0x00, 0x00,                          // zero
  };
  EXPECT_EQ(std::memcmp(bytes.data(), preamble, kLinkPreambleSize), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::array<uint8_t, kTensorHeaderSize> want;
    EncodeTensorHeader(tensors[i], want.data());
    EXPECT_EQ(std::memcmp(bytes.data() + kFirstTensor + i * kTensorHeaderSize,
                          want.data(), kTensorHeaderSize),
              0)
        << "tensor header " << i;
  }
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

// One check per rule of DecodeLinkMessage's own, each on an otherwise
// valid round of two tensor headers (the first at byte 32), and that each
// tensor header is checked by DecodeTensorHeader, which
// tests/transport/tensor_header_test.cc covers rule by rule.
TEST(NcclHeaderTest, RejectsMalformedMessages) {
  const std::string good = EncodeLinkMessage(
      Round(4, {Header(0, {2, 3}), Header(1, {4}, engine::DType::kI64)}));
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
      {"reserved u8", [](std::string* s) { (*s)[7] = 1; },
       absl::StatusCode::kInvalidArgument, "reserved"},
      {"reserved u32", [](std::string* s) { (*s)[31] = 1; },
       absl::StatusCode::kInvalidArgument, "reserved"},
      {"count", [](std::string* s) { Put32(s, 24, 3); },
       absl::StatusCode::kInvalidArgument, "a round of 3 tensors"},
      {"trailing", [](std::string* s) { s->push_back('\0'); },
       absl::StatusCode::kInvalidArgument, "bytes of headers"},
      {"first tensor header", [](std::string* s) { (*s)[kFirstTensor] = 4; },
       absl::StatusCode::kInvalidArgument,
       "bad header-link message: tensor header 0 of 2: unknown tensor kind 4"},
      {"second tensor header",
       [](std::string* s) {
         Put64(s, kFirstTensor + kTensorHeaderSize + 24, 33);
       },
       absl::StatusCode::kInvalidArgument,
       "bad header-link message: tensor header 1 of 2: I64[4] needs 32 bytes "
       "but the header announces 33"},
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
  EXPECT_THAT(m.status().message(),
              HasSubstr("has 4096 bytes, which exceeds the limit of 4095"));
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
  std::string with_round = abort;
  Put64(&with_round, 16, 1);
  EXPECT_THAT(DecodeLinkMessage(with_round, kJob, kMax).status().message(),
              HasSubstr("abort with a round number"));
  std::string too_long = abort + std::string(kMaxLinkAbortMessageBytes, 'y');
  EXPECT_THAT(DecodeLinkMessage(too_long, kJob, kMax).status().message(),
              HasSubstr("at most 4096"));

  std::string goodbye = EncodeLinkMessage(GoodbyeMessage(kJob, 2));
  EXPECT_THAT(DecodeLinkMessage(goodbye + "z", kJob, kMax).status().message(),
              HasSubstr("goodbye with a body"));
  Put32(&goodbye, 24, 1);
  EXPECT_THAT(DecodeLinkMessage(goodbye, kJob, kMax).status().message(),
              HasSubstr("goodbye with a body"));
}

}  // namespace
}  // namespace conveyor::transport
