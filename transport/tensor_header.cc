#include "transport/tensor_header.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"

namespace conveyor::transport {
namespace {

constexpr uint8_t kNumDTypes = static_cast<uint8_t>(engine::DType::kBool) + 1;

// Byte offsets of the fields, as the header comment lays them out.
constexpr size_t kKindAt = 0;
constexpr size_t kDTypeAt = 1;
constexpr size_t kNdimAt = 2;
constexpr size_t kReserved8At = 3;
constexpr size_t kMicrobatchAt = 4;
constexpr size_t kStageAt = 8;
constexpr size_t kReserved32At = 12;
constexpr size_t kStepAt = 16;
constexpr size_t kBytesAt = 24;
constexpr size_t kDimsAt = 32;
static_assert(kDimsAt + 8 * kMaxTensorHeaderDims == kTensorHeaderSize);

}  // namespace

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

void EncodeTensorHeader(const TensorHeader& h, uint8_t* out) {
  std::memset(out, 0, kTensorHeaderSize);
  out[kKindAt] = static_cast<uint8_t>(h.tag.kind);
  out[kDTypeAt] = static_cast<uint8_t>(h.dtype);
  // Saturated rather than wrapped: 256 dimensions must not read as 0.
  out[kNdimAt] = static_cast<uint8_t>(std::min<size_t>(h.shape.size(), 255));
  PutU32(out + kMicrobatchAt, static_cast<uint32_t>(h.tag.microbatch));
  PutU32(out + kStageAt, static_cast<uint32_t>(h.tag.stage));
  PutU64(out + kStepAt, static_cast<uint64_t>(h.tag.step));
  PutU64(out + kBytesAt, h.bytes);
  for (size_t i = 0; i < h.shape.size() && i < kMaxTensorHeaderDims; ++i) {
    PutU64(out + kDimsAt + 8 * i, static_cast<uint64_t>(h.shape[i]));
  }
}

absl::StatusOr<TensorHeader> DecodeTensorHeader(const uint8_t* in, uint64_t job,
                                                uint64_t max_bytes) {
  const uint8_t kind = in[kKindAt], dtype = in[kDTypeAt], ndim = in[kNdimAt];
  if (kind > static_cast<uint8_t>(TensorKind::kEvalActivation)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tensor kind ", kind));
  }
  if (dtype >= kNumDTypes) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", dtype));
  }
  if (ndim > kMaxTensorHeaderDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(ndim, " dimensions, at most ", kMaxTensorHeaderDims));
  }
  // Zero today, so a later version can give them a meaning that an old
  // reader refuses instead of ignoring.
  if (in[kReserved8At] != 0 || GetU32(in + kReserved32At) != 0) {
    return absl::InvalidArgumentError(
        "reserved bytes of a tensor header are not zero");
  }
  TensorHeader h;
  h.tag.job = job;
  h.tag.kind = static_cast<TensorKind>(kind);
  h.tag.microbatch = static_cast<int32_t>(GetU32(in + kMicrobatchAt));
  h.tag.stage = static_cast<int32_t>(GetU32(in + kStageAt));
  h.tag.step = static_cast<int64_t>(GetU64(in + kStepAt));
  h.dtype = static_cast<engine::DType>(dtype);
  h.bytes = GetU64(in + kBytesAt);
  if (h.tag.step < 0 || h.tag.microbatch < 0 || h.tag.stage < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative tag field (step ", h.tag.step, ", microbatch ",
                     h.tag.microbatch, ", stage ", h.tag.stage, ")"));
  }
  h.shape.resize(ndim);
  for (int i = 0; i < kMaxTensorHeaderDims; ++i) {
    const auto dim = static_cast<int64_t>(GetU64(in + kDimsAt + 8 * i));
    if (i >= ndim) {
      // Unused dims are zero so that every valid header has exactly one
      // encoding (the frame fuzzer checks that a decoded header re-encodes
      // to the same bytes).
      if (dim != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("unused dimension ", i, " set"));
      }
      continue;
    }
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension ", dim));
    }
    h.shape[i] = dim;
  }
  // The product is what the receiver allocates, so it must equal the
  // announced byte count, computed without wrapping.
  absl::StatusOr<uint64_t> shape_bytes = engine::ShapeBytes(h.shape, h.dtype);
  if (!shape_bytes.ok()) return shape_bytes.status();
  if (*shape_bytes != h.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        engine::DTypeName(h.dtype), engine::ShapeString(h.shape), " needs ",
        *shape_bytes, " bytes but the header announces ", h.bytes));
  }
  if (h.bytes > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", ToString(h.tag), " has ", h.bytes,
                     " bytes, which exceeds the limit of ", max_bytes));
  }
  return h;
}

}  // namespace conveyor::transport
