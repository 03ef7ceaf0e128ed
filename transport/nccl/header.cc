#include "transport/nccl/header.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace conveyor::transport {
namespace {

// Explicit byte order, so the format is the same on any host.
void PutU16(char* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint8_t GetU8(const char* p) { return static_cast<uint8_t>(*p); }
uint16_t GetU16(const char* p) {
  return static_cast<uint16_t>(GetU8(p) | (GetU8(p + 1) << 8));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(GetU8(p + i)) << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(GetU8(p + i)) << (8 * i);
  return v;
}

constexpr uint8_t kNumDTypes = static_cast<uint8_t>(engine::DType::kBool) + 1;
constexpr uint32_t kMaxStatusCode =
    static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad header-link message: ", what));
}

void EncodeTensorHeader(const TensorHeader& h, char* p) {
  std::memset(p, 0, kTensorHeaderSize);
  p[0] = static_cast<char>(h.tag.kind);
  p[1] = static_cast<char>(h.dtype);
  p[2] = static_cast<char>(h.shape.size());
  PutU32(p + 4, static_cast<uint32_t>(h.tag.microbatch));
  PutU32(p + 8, static_cast<uint32_t>(h.tag.stage));
  PutU64(p + 16, static_cast<uint64_t>(h.tag.step));
  PutU64(p + 24, h.bytes);
  for (size_t i = 0; i < h.shape.size() && i < kMaxTensorHeaderDims; ++i) {
    PutU64(p + 32 + 8 * i, static_cast<uint64_t>(h.shape[i]));
  }
}

absl::StatusOr<TensorHeader> DecodeTensorHeader(const char* p, uint64_t job,
                                                uint64_t max_tensor_bytes) {
  const uint8_t kind = GetU8(p), dtype = GetU8(p + 1), ndim = GetU8(p + 2);
  if (kind > static_cast<uint8_t>(TensorKind::kPartialSum)) {
    return Invalid(absl::StrCat("unknown tensor kind ", kind));
  }
  if (dtype >= kNumDTypes)
    return Invalid(absl::StrCat("unknown dtype ", dtype));
  if (ndim > kMaxTensorHeaderDims) {
    return Invalid(
        absl::StrCat(ndim, " dimensions, at most ", kMaxTensorHeaderDims));
  }
  if (GetU8(p + 3) != 0 || GetU32(p + 12) != 0) {
    return Invalid("reserved bytes of a tensor header are not zero");
  }
  TensorHeader h;
  h.tag.job = job;
  h.tag.kind = static_cast<TensorKind>(kind);
  h.tag.microbatch = static_cast<int32_t>(GetU32(p + 4));
  h.tag.stage = static_cast<int32_t>(GetU32(p + 8));
  h.tag.step = static_cast<int64_t>(GetU64(p + 16));
  h.dtype = static_cast<engine::DType>(dtype);
  h.bytes = GetU64(p + 24);
  if (h.tag.step < 0 || h.tag.microbatch < 0 || h.tag.stage < 0) {
    return Invalid(absl::StrCat("negative tag field (step ", h.tag.step,
                                ", microbatch ", h.tag.microbatch, ", stage ",
                                h.tag.stage, ")"));
  }
  h.shape.resize(ndim);
  for (int i = 0; i < kMaxTensorHeaderDims; ++i) {
    const auto dim = static_cast<int64_t>(GetU64(p + 32 + 8 * i));
    if (i >= ndim) {
      if (dim != 0)
        return Invalid(absl::StrCat("unused dimension ", i, " set"));
      continue;
    }
    if (dim < 0) return Invalid(absl::StrCat("negative dimension ", dim));
    h.shape[i] = dim;
  }
  // The product is what the receiver allocates, so it must equal the
  // announced byte count.
  absl::StatusOr<uint64_t> shape_bytes = engine::ShapeBytes(h.shape, h.dtype);
  if (!shape_bytes.ok()) return Invalid(shape_bytes.status().message());
  const uint64_t bytes_needed = *shape_bytes;
  if (bytes_needed != h.bytes) {
    return Invalid(absl::StrCat(
        engine::DTypeName(h.dtype), engine::ShapeString(h.shape), " needs ",
        bytes_needed, " bytes but the header announces ", h.bytes));
  }
  if (h.bytes > max_tensor_bytes) {
    return Invalid(absl::StrCat("the ", ToString(h.tag), " has ", h.bytes,
                                " bytes, more than the limit of ",
                                max_tensor_bytes));
  }
  return h;
}

}  // namespace

LinkMessage RoundMessage(uint64_t job, uint64_t round,
                         std::vector<TensorHeader> tensors) {
  LinkMessage m;
  m.kind = LinkMessageKind::kRound;
  m.job = job;
  m.round = round;
  m.tensors = std::move(tensors);
  return m;
}

LinkMessage AbortMessage(uint64_t job, const absl::Status& status) {
  LinkMessage m;
  m.kind = LinkMessageKind::kAbort;
  m.job = job;
  m.status = status;
  return m;
}

LinkMessage GoodbyeMessage(uint64_t job, uint64_t rounds) {
  LinkMessage m;
  m.kind = LinkMessageKind::kGoodbye;
  m.job = job;
  m.round = rounds;
  return m;
}

absl::StatusOr<TensorHeader> MakeTensorHeader(const Tag& tag,
                                              const engine::Tensor& tensor) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", ToString(tag), " is an undefined tensor"));
  }
  if (tag.step < 0 || tag.microbatch < 0 || tag.stage < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative field in the tag of the ", ToString(tag)));
  }
  if (tensor.rank() > kMaxTensorHeaderDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", ToString(tag), " has ", tensor.rank(), " dimensions; at most ",
        kMaxTensorHeaderDims, " can be sent"));
  }
  return TensorHeader{.tag = tag,
                      .dtype = tensor.dtype(),
                      .shape = tensor.shape(),
                      .bytes = tensor.bytes()};
}

std::string EncodeLinkMessage(const LinkMessage& message) {
  std::string out(kLinkPreambleSize, '\0');
  char* p = out.data();
  PutU32(p, kLinkMessageMagic);
  PutU16(p + 4, kLinkMessageVersion);
  p[6] = static_cast<char>(message.kind);
  PutU64(p + 8, message.job);
  switch (message.kind) {
    case LinkMessageKind::kRound: {
      PutU64(p + 16, message.round);
      PutU32(p + 24, static_cast<uint32_t>(message.tensors.size()));
      out.resize(kLinkPreambleSize +
                 kTensorHeaderSize * message.tensors.size());
      char* body = out.data() + kLinkPreambleSize;
      for (const TensorHeader& h : message.tensors) {
        EncodeTensorHeader(h, body);
        body += kTensorHeaderSize;
      }
      break;
    }
    case LinkMessageKind::kAbort: {
      CONVEYOR_CHECK(!message.status.ok(), "an abort message needs an error");
      PutU32(p + 24, static_cast<uint32_t>(message.status.code()));
      const absl::string_view text = message.status.message();
      out.append(text.data(), std::min(text.size(), kMaxLinkAbortMessageBytes));
      break;
    }
    case LinkMessageKind::kGoodbye:
      PutU64(p + 16, message.round);
      break;
  }
  return out;
}

absl::StatusOr<LinkMessage> DecodeLinkMessage(absl::string_view bytes,
                                              uint64_t expected_job,
                                              uint64_t max_tensor_bytes) {
  if (bytes.size() < kLinkPreambleSize) {
    return absl::DataLossError(absl::StrCat(
        "header-link message of ", bytes.size(), " bytes is shorter than its ",
        kLinkPreambleSize, "-byte preamble"));
  }
  const char* p = bytes.data();
  if (GetU32(p) != kLinkMessageMagic) {
    return absl::DataLossError(
        "bad header-link message: wrong magic (not from a P2pChannel)");
  }
  const uint16_t version = GetU16(p + 4);
  if (version != kLinkMessageVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("bad header-link message: protocol version ", version,
                     ", expected ", kLinkMessageVersion));
  }
  LinkMessage m;
  m.job = GetU64(p + 8);
  if (m.job != expected_job) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bad header-link message: job ", m.job, ", expected ", expected_job));
  }
  const uint8_t kind = GetU8(p + 6);
  if (kind > static_cast<uint8_t>(LinkMessageKind::kGoodbye)) {
    return Invalid(absl::StrCat("unknown kind ", kind));
  }
  if (GetU8(p + 7) != 0 || GetU32(p + 28) != 0) {
    return Invalid("reserved bytes are not zero");
  }
  m.kind = static_cast<LinkMessageKind>(kind);
  m.round = GetU64(p + 16);
  const uint32_t count = GetU32(p + 24);
  const absl::string_view body = bytes.substr(kLinkPreambleSize);
  switch (m.kind) {
    case LinkMessageKind::kRound: {
      // 64-bit arithmetic: count * 96 cannot overflow.
      const uint64_t expected = uint64_t{count} * kTensorHeaderSize;
      if (body.size() != expected) {
        return Invalid(absl::StrCat("a round of ", count, " tensors needs ",
                                    expected, " bytes of headers, not ",
                                    body.size()));
      }
      m.tensors.reserve(count);
      for (uint32_t i = 0; i < count; ++i) {
        absl::StatusOr<TensorHeader> h = DecodeTensorHeader(
            body.data() + i * kTensorHeaderSize, m.job, max_tensor_bytes);
        if (!h.ok()) return h.status();
        m.tensors.push_back(*std::move(h));
      }
      break;
    }
    case LinkMessageKind::kAbort:
      if (count == 0 || count > kMaxStatusCode) {
        return Invalid(absl::StrCat("abort with status code ", count));
      }
      if (m.round != 0) return Invalid("abort with a round number");
      if (body.size() > kMaxLinkAbortMessageBytes) {
        return Invalid(absl::StrCat("abort message of ", body.size(),
                                    " bytes, at most ",
                                    kMaxLinkAbortMessageBytes));
      }
      m.status =
          absl::Status(static_cast<absl::StatusCode>(count), std::string(body));
      break;
    case LinkMessageKind::kGoodbye:
      if (count != 0 || !body.empty()) {
        return Invalid("goodbye with a body");
      }
      break;
  }
  return m;
}

}  // namespace conveyor::transport
