// Fuzz target for the TcpChannel wire format (transport/tcp/frame.h): what a
// peer, or anything that connects to a worker's data port, can make us
// decode.
//
// Input: byte 0 selects the decoder and, for frame headers, the payload
// limit; the following bytes are the fixed-size message, zero-padded when
// short. For a frame header, whatever follows its kFrameHeaderSize (120)
// bytes is the payload an abort frame carries (the abort message), decoded
// as the channel does.
//
//   byte0 % 3 == 0  DecodeFrameHeader, limit kPayloadLimits[(byte0 / 3) % 4]
//   byte0 % 3 == 1  DecodeHello
//   byte0 % 3 == 2  DecodeHelloAck
//
// Besides "no crash", each successful decode is checked against the encoder:
// a frame header re-encodes to the same bytes, and a hello or hello reply
// survives an encode/decode round trip. A broken property aborts, which
// libFuzzer reports as a crash.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/dtype.h"
#include "transport/tcp/frame.h"

namespace {

using conveyor::transport::FrameHeader;
using conveyor::transport::FrameHeaderBytes;
using conveyor::transport::FrameKind;
using conveyor::transport::Hello;
using conveyor::transport::HelloAckBytes;
using conveyor::transport::HelloBytes;
using conveyor::transport::HelloResult;

// The job the fuzzed frames are checked against (the seed corpus uses it).
constexpr uint64_t kFuzzJob = 0x1234;
constexpr std::array<uint64_t, 4> kPayloadLimits = {
    0, 64, uint64_t{1} << 20, std::numeric_limits<uint64_t>::max()};

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "frame_fuzzer: property violated: %s\n", what);
  std::abort();
}

// The message bytes: `data`, truncated or zero-padded to N.
template <size_t N>
std::array<uint8_t, N> Fixed(const uint8_t* data, size_t size) {
  std::array<uint8_t, N> out{};
  if (size > 0) std::memcpy(out.data(), data, std::min(size, N));
  return out;
}

// What frame.h promises of an abort, goodbye or message frame: its payload
// is described as U8 of shape {payload_bytes} under a zero tag.
bool IsZeroTagByteString(const FrameHeader& h) {
  return h.dtype == conveyor::engine::DType::kU8 && h.shape.size() == 1 &&
         h.shape[0] >= 0 &&
         static_cast<uint64_t>(h.shape[0]) == h.payload_bytes && h.step == 0 &&
         h.microbatch == 0 && h.stage == 0;
}

void FuzzFrameHeader(const uint8_t* data, size_t size, uint64_t limit) {
  const FrameHeaderBytes bytes =
      Fixed<conveyor::transport::kFrameHeaderSize>(data, size);
  absl::StatusOr<FrameHeader> h =
      conveyor::transport::DecodeFrameHeader(bytes, kFuzzJob, limit);
  if (!h.ok()) return;
  // Every byte of a valid header is determined by its fields.
  FrameHeaderBytes again;
  conveyor::transport::EncodeFrameHeader(*h, &again);
  if (again != bytes) Fail("a decoded frame header re-encodes differently");
  if (h->job != kFuzzJob) Fail("frame header for another job accepted");
  if (h->shape.size() > conveyor::transport::kMaxFrameDims) {
    Fail("frame header with too many dimensions accepted");
  }
  // The input after the header: the payload, as much of it as there is.
  std::string payload;
  if (size > bytes.size()) {
    payload.assign(reinterpret_cast<const char*>(data) + bytes.size(),
                   size - bytes.size());
  }
  switch (h->kind) {
    case FrameKind::kActivation:
    case FrameKind::kGradient:
    case FrameKind::kPartialSum:
    case FrameKind::kEvalActivation: {
      if (h->payload_bytes > limit) Fail("tensor payload over the limit");
      // What the reader does next, short of allocating the payload.
      const conveyor::transport::Tag tag = conveyor::transport::TagOf(*h);
      if (tag.step < 0 || tag.microbatch < 0 || tag.stage < 0) {
        Fail("negative tag accepted");
      }
      break;
    }
    case FrameKind::kAbort: {
      if (!IsZeroTagByteString(*h)) Fail("abort frame is not a byte string");
      if (h->payload_bytes > conveyor::transport::kMaxAbortMessageBytes) {
        Fail("abort message over the limit");
      }
      // The channel reads exactly payload_bytes of message and fails with
      // the sender's code; here the message is what the input has of it.
      const std::string message =
          payload.substr(0, static_cast<size_t>(std::min<uint64_t>(
                                payload.size(), h->payload_bytes)));
      const absl::Status status(static_cast<absl::StatusCode>(h->status_code),
                                message);
      if (status.ok()) Fail("abort frame decodes to an OK status");
      break;
    }
    case FrameKind::kGoodbye:
      if (!IsZeroTagByteString(*h)) Fail("goodbye frame is not a byte string");
      if (h->payload_bytes != 0) Fail("goodbye frame with a payload");
      break;
    case FrameKind::kMessage:
      if (!IsZeroTagByteString(*h)) Fail("message frame is not a byte string");
      // Read whole into a string for the message handler: bounded.
      if (h->payload_bytes > conveyor::transport::kMaxMessageBytes ||
          h->status_code != 0) {
        Fail("message frame over the limit or with a status code");
      }
      break;
  }
}

void FuzzHello(const uint8_t* data, size_t size) {
  const HelloBytes bytes = Fixed<conveyor::transport::kHelloSize>(data, size);
  absl::StatusOr<Hello> hello = conveyor::transport::DecodeHello(bytes);
  if (!hello.ok()) return;
  if (hello->secret.size() > conveyor::transport::kMaxSecretBytes) {
    Fail("hello secret over the limit");
  }
  HelloBytes again;
  conveyor::transport::EncodeHello(*hello, &again);
  absl::StatusOr<Hello> round = conveyor::transport::DecodeHello(again);
  if (!round.ok() || round->version != hello->version ||
      round->from_rank != hello->from_rank ||
      round->to_rank != hello->to_rank || round->job != hello->job ||
      round->secret != hello->secret) {
    Fail("hello does not survive a round trip");
  }
  // The acceptor's secret check: must agree with plain equality.
  static const std::string kSecret = "fuzz-secret";
  if (conveyor::transport::ConstantTimeEquals(hello->secret, kSecret) !=
      (hello->secret == kSecret)) {
    Fail("ConstantTimeEquals disagrees with ==");
  }
}

void FuzzHelloAck(const uint8_t* data, size_t size) {
  const HelloAckBytes bytes =
      Fixed<conveyor::transport::kHelloAckSize>(data, size);
  absl::StatusOr<HelloResult> result =
      conveyor::transport::DecodeHelloAck(bytes);
  if (!result.ok()) return;
  if (conveyor::transport::HelloResultName(*result).empty()) {
    Fail("hello result without a name");
  }
  HelloAckBytes again;
  conveyor::transport::EncodeHelloAck(*result, &again);
  absl::StatusOr<HelloResult> round =
      conveyor::transport::DecodeHelloAck(again);
  if (!round.ok() || *round != *result) {
    Fail("hello reply does not survive a round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  ++data;
  --size;
  switch (selector % 3) {
    case 0:
      FuzzFrameHeader(data, size,
                      kPayloadLimits[(selector / 3) % kPayloadLimits.size()]);
      break;
    case 1:
      FuzzHello(data, size);
      break;
    case 2:
      FuzzHelloAck(data, size);
      break;
  }
  return 0;
}
