#include "transport/nccl/header.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/little_endian.h"

namespace conveyor::transport {
namespace {

constexpr uint32_t kMaxStatusCode =
    static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad header-link message: ", what));
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
        EncodeTensorHeader(h, reinterpret_cast<uint8_t*>(body));
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
  const uint8_t kind = static_cast<uint8_t>(p[6]);
  if (kind > static_cast<uint8_t>(LinkMessageKind::kGoodbye)) {
    return Invalid(absl::StrCat("unknown kind ", kind));
  }
  if (static_cast<uint8_t>(p[7]) != 0 || GetU32(p + 28) != 0) {
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
      const auto* headers = reinterpret_cast<const uint8_t*>(body.data());
      for (uint32_t i = 0; i < count; ++i) {
        absl::StatusOr<TensorHeader> h = DecodeTensorHeader(
            headers + i * kTensorHeaderSize, m.job, max_tensor_bytes);
        if (!h.ok()) {
          return Invalid(absl::StrCat("tensor header ", i, " of ", count, ": ",
                                      h.status().message()));
        }
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
