#include "transport/tcp/frame.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"

namespace conveyor::transport {
namespace {

constexpr uint32_t kMaxStatusCode =
    static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("bad frame header: ", what));
}

static_assert(kFrameHeaderSize == 120, "the layout in frame.h");

bool IsTensorFrame(FrameKind kind) {
  return kind == FrameKind::kActivation || kind == FrameKind::kGradient ||
         kind == FrameKind::kPartialSum || kind == FrameKind::kEvalActivation;
}

// The tensor kind a frame's tensor header carries: its own for a tensor
// frame, kActivation (0, part of the zero tag) for any other.
TensorKind TensorKindOf(FrameKind kind) {
  switch (kind) {
    case FrameKind::kGradient:
      return TensorKind::kGradient;
    case FrameKind::kPartialSum:
      return TensorKind::kPartialSum;
    case FrameKind::kEvalActivation:
      return TensorKind::kEvalActivation;
    case FrameKind::kActivation:
    case FrameKind::kAbort:
    case FrameKind::kGoodbye:
    case FrameKind::kMessage:
      break;
  }
  return TensorKind::kActivation;
}

absl::string_view FrameKindName(FrameKind kind) {
  switch (kind) {
    case FrameKind::kActivation:
      return "activation";
    case FrameKind::kGradient:
      return "gradient";
    case FrameKind::kAbort:
      return "abort";
    case FrameKind::kGoodbye:
      return "goodbye";
    case FrameKind::kMessage:
      return "message";
    case FrameKind::kPartialSum:
      return "partial sum";
    case FrameKind::kEvalActivation:
      return "evaluation activation";
  }
  return "unknown";
}

}  // namespace

absl::string_view HelloResultName(HelloResult result) {
  switch (result) {
    case HelloResult::kOk:
      return "accepted";
    case HelloResult::kBadVersion:
      return "unsupported protocol version";
    case HelloResult::kWrongJob:
      return "wrong job";
    case HelloResult::kBadSecret:
      return "wrong secret";
    case HelloResult::kWrongRank:
      return "wrong rank";
    case HelloResult::kDuplicate:
      return "rank already connected";
  }
  return "unknown result";
}

absl::StatusOr<FrameHeader> TensorFrameHeader(const Tag& tag,
                                              const engine::Tensor& tensor) {
  absl::StatusOr<TensorHeader> th = MakeTensorHeader(tag, tensor);
  if (!th.ok()) return th.status();
  FrameHeader h;
  switch (tag.kind) {
    case TensorKind::kActivation:
      h.kind = FrameKind::kActivation;
      break;
    case TensorKind::kGradient:
      h.kind = FrameKind::kGradient;
      break;
    case TensorKind::kPartialSum:
      h.kind = FrameKind::kPartialSum;
      break;
    case TensorKind::kEvalActivation:
      h.kind = FrameKind::kEvalActivation;
      break;
  }
  h.dtype = th->dtype;
  h.shape = std::move(th->shape);
  h.job = tag.job;
  h.step = tag.step;
  h.microbatch = tag.microbatch;
  h.stage = tag.stage;
  h.payload_bytes = th->bytes;
  return h;
}

std::string AbortPayload(const absl::Status& status) {
  std::string message(status.message());
  if (message.size() > kMaxAbortMessageBytes) {
    message.resize(kMaxAbortMessageBytes);
  }
  return message;
}

FrameHeader AbortFrameHeader(uint64_t job, const absl::Status& status) {
  FrameHeader h;
  h.kind = FrameKind::kAbort;
  h.dtype = engine::DType::kU8;
  h.job = job;
  h.status_code = static_cast<uint32_t>(status.code());
  h.payload_bytes = AbortPayload(status).size();
  h.shape = {static_cast<int64_t>(h.payload_bytes)};
  return h;
}

FrameHeader GoodbyeFrameHeader(uint64_t job) {
  FrameHeader h;
  h.kind = FrameKind::kGoodbye;
  h.dtype = engine::DType::kU8;
  h.job = job;
  h.shape = {0};
  return h;
}

FrameHeader MessageFrameHeader(uint64_t job, size_t bytes) {
  FrameHeader h;
  h.kind = FrameKind::kMessage;
  h.dtype = engine::DType::kU8;
  h.job = job;
  h.payload_bytes = bytes;
  h.shape = {static_cast<int64_t>(bytes)};
  return h;
}

Tag TagOf(const FrameHeader& header) {
  return {.job = header.job,
          .step = header.step,
          .microbatch = header.microbatch,
          .stage = header.stage,
          .kind = TensorKindOf(header.kind)};
}

void EncodeHello(const Hello& hello, HelloBytes* out) {
  uint8_t* p = out->data();
  out->fill(0);
  const size_t secret_bytes = std::min(hello.secret.size(), kMaxSecretBytes);
  PutU32(p, kHelloMagic);
  PutU16(p + 4, hello.version);
  PutU16(p + 6, static_cast<uint16_t>(secret_bytes));
  PutU32(p + 8, static_cast<uint32_t>(hello.from_rank));
  PutU32(p + 12, static_cast<uint32_t>(hello.to_rank));
  PutU64(p + 16, hello.job);
  std::memcpy(p + 24, hello.secret.data(), secret_bytes);
}

absl::StatusOr<Hello> DecodeHello(const HelloBytes& bytes) {
  const uint8_t* p = bytes.data();
  if (GetU32(p) != kHelloMagic) {
    return absl::DataLossError("not a Conveyor hello (bad magic)");
  }
  const uint16_t secret_bytes = GetU16(p + 6);
  if (secret_bytes > kMaxSecretBytes) {
    return absl::DataLossError(absl::StrCat(
        "hello secret length ", secret_bytes, " exceeds ", kMaxSecretBytes));
  }
  Hello hello;
  hello.version = GetU16(p + 4);
  hello.from_rank = static_cast<int32_t>(GetU32(p + 8));
  hello.to_rank = static_cast<int32_t>(GetU32(p + 12));
  hello.job = GetU64(p + 16);
  hello.secret.assign(reinterpret_cast<const char*>(p + 24), secret_bytes);
  return hello;
}

void EncodeHelloAck(HelloResult result, HelloAckBytes* out) {
  PutU32(out->data(), kHelloAckMagic);
  PutU16(out->data() + 4, kWireVersion);
  PutU16(out->data() + 6, static_cast<uint16_t>(result));
}

absl::StatusOr<HelloResult> DecodeHelloAck(const HelloAckBytes& bytes) {
  if (GetU32(bytes.data()) != kHelloAckMagic) {
    return absl::DataLossError("not a Conveyor hello reply (bad magic)");
  }
  const uint16_t result = GetU16(bytes.data() + 6);
  if (result > static_cast<uint16_t>(HelloResult::kDuplicate)) {
    return absl::DataLossError(
        absl::StrCat("unknown hello reply code ", result));
  }
  return static_cast<HelloResult>(result);
}

void EncodeFrameHeader(const FrameHeader& h, FrameHeaderBytes* out) {
  uint8_t* p = out->data();
  out->fill(0);
  PutU32(p, kFrameMagic);
  PutU16(p + 4, kWireVersion);
  p[6] = static_cast<uint8_t>(h.kind);
  PutU32(p + 8, h.status_code);
  PutU64(p + 16, h.job);
  EncodeTensorHeader({.tag = {.job = h.job,
                              .step = h.step,
                              .microbatch = h.microbatch,
                              .stage = h.stage,
                              .kind = TensorKindOf(h.kind)},
                      .dtype = h.dtype,
                      .shape = h.shape,
                      .bytes = h.payload_bytes},
                     p + kFramePreambleSize);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(const FrameHeaderBytes& bytes,
                                              uint64_t expected_job,
                                              uint64_t max_payload_bytes) {
  const uint8_t* p = bytes.data();
  if (GetU32(p) != kFrameMagic) {
    return absl::DataLossError(
        "bad frame header: wrong magic (stream out of sync or not Conveyor)");
  }
  const uint16_t version = GetU16(p + 4);
  if (version != kWireVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("bad frame header: protocol version ", version,
                     ", expected ", kWireVersion));
  }
  FrameHeader h;
  h.job = GetU64(p + 16);
  if (h.job != expected_job) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bad frame header: job ", h.job, ", expected ", expected_job));
  }
  const uint8_t kind = p[6];
  if (kind > static_cast<uint8_t>(FrameKind::kEvalActivation)) {
    return Invalid(absl::StrCat("unknown kind ", kind));
  }
  if (p[7] != 0 || GetU32(p + 12) != 0) {
    return Invalid("reserved bytes are not zero");
  }
  h.kind = static_cast<FrameKind>(kind);
  h.status_code = GetU32(p + 8);
  // A tensor frame's payload is bounded by the caller's limit here; the
  // other kinds' byte strings by their own, smaller limits below, with
  // errors that say which.
  absl::StatusOr<TensorHeader> th = DecodeTensorHeader(
      p + kFramePreambleSize, h.job,
      IsTensorFrame(h.kind) ? max_payload_bytes
                            : std::numeric_limits<uint64_t>::max());
  if (!th.ok()) return Invalid(th.status().message());
  h.dtype = th->dtype;
  h.step = th->tag.step;
  h.microbatch = th->tag.microbatch;
  h.stage = th->tag.stage;
  h.payload_bytes = th->bytes;
  h.shape = std::move(th->shape);
  if (IsTensorFrame(h.kind)) {
    if (th->tag.kind != TensorKindOf(h.kind)) {
      return Invalid(absl::StrCat(FrameKindName(h.kind),
                                  " frame with a tensor header of kind ",
                                  static_cast<int>(th->tag.kind)));
    }
    if (h.status_code != 0) return Invalid("status code on a tensor frame");
    return h;
  }
  // A byte string under a zero tag: anything else would be a second
  // encoding of the same frame, or a tensor frame in disguise.
  if (th->tag.kind != TensorKind::kActivation || h.step != 0 ||
      h.microbatch != 0 || h.stage != 0) {
    return Invalid(
        absl::StrCat(FrameKindName(h.kind), " frame with a tag (kind ",
                     static_cast<int>(th->tag.kind), ", step ", h.step,
                     ", microbatch ", h.microbatch, ", stage ", h.stage, ")"));
  }
  const bool byte_string = h.dtype == engine::DType::kU8 && h.shape.size() == 1;
  switch (h.kind) {
    case FrameKind::kAbort:
      if (h.status_code == 0 || h.status_code > kMaxStatusCode) {
        return Invalid(
            absl::StrCat("abort frame with status code ", h.status_code));
      }
      if (!byte_string || h.payload_bytes > kMaxAbortMessageBytes) {
        return Invalid(
            absl::StrCat("abort frame is not a U8 message of at most ",
                         kMaxAbortMessageBytes, " bytes"));
      }
      break;
    case FrameKind::kGoodbye:
      if (h.status_code != 0 || h.payload_bytes != 0) {
        return Invalid("goodbye frame with a payload");
      }
      if (!byte_string)
        return Invalid("goodbye frame is not an empty U8 message");
      break;
    case FrameKind::kMessage:
      if (h.status_code != 0 || !byte_string ||
          h.payload_bytes > kMaxMessageBytes) {
        return Invalid(
            absl::StrCat("message frame is not a U8 message of at most ",
                         kMaxMessageBytes, " bytes"));
      }
      break;
    case FrameKind::kActivation:
    case FrameKind::kGradient:
    case FrameKind::kPartialSum:
    case FrameKind::kEvalActivation:
      break;  // Returned above.
  }
  return h;
}

}  // namespace conveyor::transport
