// TensorHeader: what a receiver must know about a tensor before its bytes
// arrive (its tag, dtype, shape and byte count), and its one wire encoding.
// Both data planes announce tensors with it: the TCP frame header
// (transport/tcp/frame.h) embeds it after a short preamble, and the NCCL
// header link's round messages (transport/nccl/header.h) are a preamble and
// a list of them. Decoding validates every field here, in one place, so a
// rule about what a peer may announce cannot hold on one transport and not
// on the other.
//
// The encoding is 96 bytes, all integers little-endian:
//   0  u8 kind (TensorKind)  1  u8 dtype (engine::DType)  2  u8 ndim (<= 8)
//   3  u8 zero               4  i32 microbatch            8  i32 stage
//   12 u32 zero             16  i64 step                 24  u64 bytes
//   32 i64[8] dims (unused: 0)
// The job is not in it: every message that carries tensor headers names the
// job once, in its own preamble, and checks it there.
//
// Thread-safe: stateless functions.
#ifndef CONVEYOR_TRANSPORT_TENSOR_HEADER_H_
#define CONVEYOR_TRANSPORT_TENSOR_HEADER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/dtype.h"
#include "engine/tensor.h"
#include "transport/channel.h"

namespace conveyor::transport {

inline constexpr size_t kTensorHeaderSize = 96;
inline constexpr int kMaxTensorHeaderDims = 8;

// What a receiver needs to post the receive of one tensor before its bytes
// arrive: where to file it (tag), and what to allocate.
struct TensorHeader {
  Tag tag;
  engine::DType dtype = engine::DType::kF32;
  engine::Shape shape;
  uint64_t bytes = 0;  // numel * DTypeSize(dtype).

  friend bool operator==(const TensorHeader&, const TensorHeader&) = default;
};

// The header announcing `tensor` under `tag`. InvalidArgument for what can
// never be sent: an undefined tensor, negative tag fields, more than
// kMaxTensorHeaderDims dimensions. Checked by the sender, so the error
// reaches the caller of Send instead of the peer.
absl::StatusOr<TensorHeader> MakeTensorHeader(const Tag& tag,
                                              const engine::Tensor& tensor);

// Writes kTensorHeaderSize bytes at `out`. Encodes whatever it is given,
// valid or not, so tests can build bad headers with it; a header with more
// than kMaxTensorHeaderDims dimensions keeps its ndim and loses the extra
// dims, which DecodeTensorHeader rejects. `header.tag.job` is not written.
void EncodeTensorHeader(const TensorHeader& header, uint8_t* out);

// Decodes and fully validates the kTensorHeaderSize bytes at `in`, a header
// of job `job` (which the caller has checked): the kind, dtype, ndim <= 8,
// reserved bytes zero, tag fields >= 0, dims >= 0 with unused dims zero,
// numel * dtype size == bytes without overflow, and bytes <= max_bytes.
// InvalidArgument, with a message that names the broken rule and no prefix:
// callers say which message it came from. A caller may allocate `bytes` once
// this returns OK.
absl::StatusOr<TensorHeader> DecodeTensorHeader(const uint8_t* in, uint64_t job,
                                                uint64_t max_bytes);

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_TENSOR_HEADER_H_
