// The TcpChannel wire format: the connection handshake and the frames that
// follow it. Pure encoding and validation, no sockets, so every rule about
// what a peer may send is tested here without a network.
//
// A connection carries data one way only: the rank that sends tensors to a
// peer opens it, introduces itself with a Hello, waits for the HelloAck, and
// from then on writes frames; the accepting rank only reads frames. All
// integers are little-endian; sizes are fixed so a reader always knows how
// many bytes to read before it trusts anything.
//
// Hello (88 bytes), connector -> acceptor:
//   0  u32 magic "CVYH"     4  u16 version        6  u16 secret length
//   8  i32 sender rank     12  i32 receiver rank  16  u64 job
//   24 u8[64] secret, zero-padded
// HelloAck (8 bytes), acceptor -> connector:
//   0  u32 magic "CVYA"     4  u16 version        6  u16 HelloResult
// Frame header (120 bytes), then `payload bytes` of payload: a preamble,
// then a tensor header (transport/tensor_header.h, the encoding the NCCL
// header link uses too) that describes the payload:
//   0  u32 magic "CVYF"     4  u16 version        6  u8 kind (FrameKind)
//   7  u8 zero              8  u32 status code (abort frames; else 0)
//   12 u32 zero            16  u64 job
//   24 tensor header (96 bytes), so at frame offsets:
//      24 u8 tensor kind    25 u8 dtype           26 u8 ndim (<= 8)
//      27 u8 zero           28 i32 microbatch     32 i32 stage
//      36 u32 zero          40 i64 step           48 u64 payload bytes
//      56 i64[8] dims (unused: 0)
//
// Frame kinds: an activation, gradient or partial sum carries a tensor,
// which the tensor header describes (its tensor kind must match the frame
// kind); an abort frame carries the sender's abort status (its code, and
// its message as the payload) so every worker fails with the original
// reason; a goodbye frame (empty) says the sender closed its channel on
// purpose, so the reader does not take the following end of file for a lost
// peer; a message frame carries opaque bytes (at most kMaxMessageBytes) for
// the channel's message handler: the NCCL channel's tensor headers ride on
// them (tcp_header_link.h), in order with the frames before and after.
//
// Every frame's tensor header describes its payload, so one set of rules
// (the byte count matches the shape, and is bounded before anything is
// allocated) covers every payload a reader reads. The payload of an abort,
// goodbye or message frame is a byte string: its tensor header says U8 of
// shape {n} under a zero tag (kind activation, step, microbatch and stage
// 0), and the decoder insists on exactly that, so every valid frame has a
// single encoding.
//
// The secret travels in the clear: it keeps stray processes and other jobs
// off the data plane, not eavesdroppers (run jobs on a private network). In
// a cluster with an auth token it is not the job's secret but an HMAC of it
// under the token (common/auth_token.h: DataPlaneSecret, 64 hex digits), so
// joining needs the token, and the token never appears on the wire.
//
// Thread-safe: stateless functions.
#ifndef CONVEYOR_TRANSPORT_TCP_FRAME_H_
#define CONVEYOR_TRANSPORT_TCP_FRAME_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/auth_token.h"
#include "engine/dtype.h"
#include "engine/tensor.h"
#include "transport/channel.h"
#include "transport/tensor_header.h"

namespace conveyor::transport {

inline constexpr uint32_t kHelloMagic = 0x48595643;     // "CVYH"
inline constexpr uint32_t kHelloAckMagic = 0x41595643;  // "CVYA"
inline constexpr uint32_t kFrameMagic = 0x46595643;     // "CVYF"
// 2: the frame header embeds the shared tensor header (120 bytes, was 112).
inline constexpr uint16_t kWireVersion = 2;
inline constexpr size_t kHelloSize = 88;
inline constexpr size_t kHelloAckSize = 8;
// The frame header: its preamble, then the payload's tensor header.
inline constexpr size_t kFramePreambleSize = 24;
inline constexpr size_t kFrameHeaderSize =
    kFramePreambleSize + kTensorHeaderSize;
inline constexpr size_t kMaxSecretBytes = 64;
inline constexpr int kMaxFrameDims = kMaxTensorHeaderDims;
// Abort messages are truncated to this; the limit also bounds what a reader
// allocates for one.
inline constexpr size_t kMaxAbortMessageBytes = 4096;
// Message frames: small control messages (NCCL tensor headers are a few
// hundred bytes); the bound keeps what a reader allocates for one small.
inline constexpr size_t kMaxMessageBytes = 64 * 1024;

using HelloBytes = std::array<uint8_t, kHelloSize>;
using HelloAckBytes = std::array<uint8_t, kHelloAckSize>;
using FrameHeaderBytes = std::array<uint8_t, kFrameHeaderSize>;

struct Hello {
  uint16_t version = kWireVersion;
  int32_t from_rank = 0;
  int32_t to_rank = 0;
  uint64_t job = 0;
  std::string secret;  // At most kMaxSecretBytes.
};

// The acceptor's verdict. Anything but kOk is followed by a close.
enum class HelloResult : uint16_t {
  kOk = 0,
  kBadVersion = 1,
  kWrongJob = 2,
  kBadSecret = 3,
  kWrongRank = 4,  // Not addressed to this rank, or sender out of range.
  kDuplicate = 5,  // The sender rank is already connected.
};

absl::string_view HelloResultName(HelloResult result);

// Tensor frames carry a TensorKind: kActivation and kGradient have its
// values, kPartialSum and kEvalActivation came later and have their own
// (TagOf converts).
enum class FrameKind : uint8_t {
  kActivation = 0,
  kGradient = 1,
  kAbort = 2,
  kGoodbye = 3,
  kMessage = 4,
  kPartialSum = 5,
  kEvalActivation = 6,
};

struct FrameHeader {
  FrameKind kind = FrameKind::kActivation;
  engine::DType dtype = engine::DType::kF32;
  engine::Shape shape;
  uint64_t job = 0;
  int64_t step = 0;
  int32_t microbatch = 0;
  int32_t stage = 0;
  uint32_t status_code = 0;  // absl::StatusCode of an abort frame.
  uint64_t payload_bytes = 0;
};

// The header announcing `tensor` under `tag`. InvalidArgument when the tag
// or tensor cannot be sent (MakeTensorHeader: an undefined tensor, negative
// tag fields, more than kMaxFrameDims dimensions): checked at Send, so the
// error reaches the caller instead of the peer.
absl::StatusOr<FrameHeader> TensorFrameHeader(const Tag& tag,
                                              const engine::Tensor& tensor);
// An abort frame for `status` (not OK); its payload is AbortPayload(status).
FrameHeader AbortFrameHeader(uint64_t job, const absl::Status& status);
std::string AbortPayload(const absl::Status& status);
FrameHeader GoodbyeFrameHeader(uint64_t job);
// A message frame of `bytes` payload bytes (at most kMaxMessageBytes).
FrameHeader MessageFrameHeader(uint64_t job, size_t bytes);

// The tag of a tensor frame (kind activation, gradient or partial sum).
Tag TagOf(const FrameHeader& header);

void EncodeHello(const Hello& hello, HelloBytes* out);
// Checks the magic and secret length only: the acceptor decides about the
// version, job, ranks and secret, and answers with a HelloResult.
// DataLoss when the bytes are not a Conveyor hello.
absl::StatusOr<Hello> DecodeHello(const HelloBytes& bytes);

void EncodeHelloAck(HelloResult result, HelloAckBytes* out);
// DataLoss for a bad magic or unknown result code.
absl::StatusOr<HelloResult> DecodeHelloAck(const HelloAckBytes& bytes);

void EncodeFrameHeader(const FrameHeader& header, FrameHeaderBytes* out);

// Decodes and fully validates a header before any payload is read: the
// magic (DataLoss), the version, job (FailedPrecondition), then the frame
// kind and reserved bytes, the tensor header by DecodeTensorHeader's rules
// (kind, dtype, ndim <= 8, reserved bytes zero, tag fields >= 0, dims >= 0
// with unused dims zero, numel * dtype size == payload bytes without
// overflow), and the frame kind's own: tensor frames have no status code, a
// tensor kind that matches the frame kind, and payload bytes <=
// max_payload_bytes; abort, goodbye and message frames have a zero tag and
// a U8 payload of shape {n}, an abort frame a known non-OK status code and
// at most kMaxAbortMessageBytes, a goodbye frame none and no payload, a
// message frame none and at most kMaxMessageBytes (InvalidArgument). A
// caller may allocate `payload_bytes` once this returns OK.
absl::StatusOr<FrameHeader> DecodeFrameHeader(const FrameHeaderBytes& bytes,
                                              uint64_t expected_job,
                                              uint64_t max_payload_bytes);

// Compares handshake secrets (common/auth_token.h).
using ::conveyor::ConstantTimeEquals;

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_TCP_FRAME_H_
