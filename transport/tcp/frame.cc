#include "transport/tcp/frame.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace conveyor::transport {
namespace {

// Explicit byte order, so the format is the same on any host.
void PutU16(uint8_t* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t GetU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

constexpr uint8_t kNumDTypes = static_cast<uint8_t>(engine::DType::kBool) + 1;
constexpr uint32_t kMaxStatusCode =
    static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("bad frame header: ", what));
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
  if (tag.step < 0 || tag.microbatch < 0 || tag.stage < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative field in the tag of the ", ToString(tag)));
  }
  if (tensor.rank() > kMaxFrameDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", ToString(tag), " has ", tensor.rank(),
                     " dimensions; at most ", kMaxFrameDims, " can be sent"));
  }
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
  }
  h.dtype = tensor.dtype();
  h.shape = tensor.shape();
  h.job = tag.job;
  h.step = tag.step;
  h.microbatch = tag.microbatch;
  h.stage = tag.stage;
  h.payload_bytes = tensor.bytes();
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
          .kind = header.kind == FrameKind::kPartialSum
                      ? TensorKind::kPartialSum
                      : static_cast<TensorKind>(header.kind)};
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
  p[7] = static_cast<uint8_t>(h.dtype);
  p[8] = static_cast<uint8_t>(h.shape.size());
  PutU32(p + 12, static_cast<uint32_t>(h.microbatch));
  PutU32(p + 16, static_cast<uint32_t>(h.stage));
  PutU32(p + 20, h.status_code);
  PutU64(p + 24, h.job);
  PutU64(p + 32, static_cast<uint64_t>(h.step));
  PutU64(p + 40, h.payload_bytes);
  for (size_t i = 0; i < h.shape.size() && i < kMaxFrameDims; ++i) {
    PutU64(p + 48 + 8 * i, static_cast<uint64_t>(h.shape[i]));
  }
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
  h.job = GetU64(p + 24);
  if (h.job != expected_job) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bad frame header: job ", h.job, ", expected ", expected_job));
  }
  const uint8_t kind = p[6], dtype = p[7], ndim = p[8];
  if (kind > static_cast<uint8_t>(FrameKind::kPartialSum)) {
    return Invalid(absl::StrCat("unknown kind ", kind));
  }
  if (dtype >= kNumDTypes)
    return Invalid(absl::StrCat("unknown dtype ", dtype));
  if (ndim > kMaxFrameDims) {
    return Invalid(absl::StrCat(ndim, " dimensions, at most ", kMaxFrameDims));
  }
  if (p[9] != 0 || p[10] != 0 || p[11] != 0) {
    return Invalid("reserved bytes are not zero");
  }
  h.kind = static_cast<FrameKind>(kind);
  h.dtype = static_cast<engine::DType>(dtype);
  h.microbatch = static_cast<int32_t>(GetU32(p + 12));
  h.stage = static_cast<int32_t>(GetU32(p + 16));
  h.status_code = GetU32(p + 20);
  h.step = static_cast<int64_t>(GetU64(p + 32));
  h.payload_bytes = GetU64(p + 40);
  if (h.step < 0 || h.microbatch < 0 || h.stage < 0) {
    return Invalid(absl::StrCat("negative tag field (step ", h.step,
                                ", microbatch ", h.microbatch, ", stage ",
                                h.stage, ")"));
  }
  h.shape.resize(ndim);
  for (int i = 0; i < kMaxFrameDims; ++i) {
    const auto dim = static_cast<int64_t>(GetU64(p + 48 + 8 * i));
    if (i >= ndim) {
      if (dim != 0)
        return Invalid(absl::StrCat("unused dimension ", i, " set"));
      continue;
    }
    if (dim < 0) {
      return Invalid(absl::StrCat("negative dimension ", dim));
    }
    h.shape[i] = dim;
  }
  // The product is what the reader will allocate, so it must equal the
  // announced payload.
  absl::StatusOr<uint64_t> shape_bytes = engine::ShapeBytes(h.shape, h.dtype);
  if (!shape_bytes.ok()) return Invalid(shape_bytes.status().message());
  const uint64_t bytes_needed = *shape_bytes;
  if (bytes_needed != h.payload_bytes) {
    return Invalid(absl::StrCat(
        engine::DTypeName(h.dtype), engine::ShapeString(h.shape), " needs ",
        bytes_needed, " bytes but the frame announces ", h.payload_bytes));
  }
  switch (h.kind) {
    case FrameKind::kActivation:
    case FrameKind::kGradient:
    case FrameKind::kPartialSum:
      if (h.status_code != 0) return Invalid("status code on a tensor frame");
      if (h.payload_bytes > max_payload_bytes) {
        return Invalid(absl::StrCat("payload of ", h.payload_bytes,
                                    " bytes exceeds the limit of ",
                                    max_payload_bytes));
      }
      break;
    case FrameKind::kAbort:
      if (h.status_code == 0 || h.status_code > kMaxStatusCode) {
        return Invalid(
            absl::StrCat("abort frame with status code ", h.status_code));
      }
      if (h.dtype != engine::DType::kU8 || ndim != 1 ||
          h.payload_bytes > kMaxAbortMessageBytes) {
        return Invalid("abort frame is not a U8 message of at most 4096 bytes");
      }
      break;
    case FrameKind::kGoodbye:
      if (h.status_code != 0 || h.payload_bytes != 0) {
        return Invalid("goodbye frame with a payload");
      }
      break;
    case FrameKind::kMessage:
      if (h.status_code != 0 || h.dtype != engine::DType::kU8 || ndim != 1 ||
          h.payload_bytes > kMaxMessageBytes) {
        return Invalid(
            absl::StrCat("message frame is not a U8 message of at most ",
                         kMaxMessageBytes, " bytes"));
      }
      break;
  }
  return h;
}

}  // namespace conveyor::transport
