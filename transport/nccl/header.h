// The messages a P2pChannel sends over its HeaderLink: per round, the headers
// (tag, dtype, shape, byte count) of the tensors whose payloads follow over
// the communicator (NCCL); plus abort and goodbye notices. Pure encoding and
// validation, no CUDA, so every rule about what a peer may send is tested on
// any machine (tests/transport/nccl_header_test.cc).
//
// All integers are little-endian. A message is a 32-byte preamble, then a
// body whose size the preamble fixes, so a reader knows exactly what to
// expect before it trusts anything:
//   0  u32 magic "CVYN"   4  u16 version   6  u8 kind   7  u8 zero
//   8  u64 job           16  u64 round    24  u32 count  28  u32 zero
// kRound:   `round` is the round number, `count` the number of tensor
//           headers that follow, kTensorHeaderSize (96) bytes each, in the
//           encoding of transport/tensor_header.h, the same one a TCP frame
//           header embeds.
// kAbort:   `count` is the absl::StatusCode (not OK); the status message
//           follows as the rest of the message (at most 4096 bytes).
// kGoodbye: `round` is the number of rounds the sender proposed (it takes
//           part in rounds below that and in no later one); no body.
//
// Thread-safe: stateless functions.
#ifndef CONVEYOR_TRANSPORT_NCCL_HEADER_H_
#define CONVEYOR_TRANSPORT_NCCL_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/channel.h"
#include "transport/tensor_header.h"

namespace conveyor::transport {

inline constexpr uint32_t kLinkMessageMagic = 0x4E595643;  // "CVYN"
inline constexpr uint16_t kLinkMessageVersion = 1;
inline constexpr size_t kLinkPreambleSize = 32;
// Abort messages are truncated to this; it also bounds what a reader keeps.
inline constexpr size_t kMaxLinkAbortMessageBytes = 4096;

enum class LinkMessageKind : uint8_t { kRound = 0, kAbort = 1, kGoodbye = 2 };

struct LinkMessage {
  LinkMessageKind kind = LinkMessageKind::kRound;
  uint64_t job = 0;
  // kRound: the round number; kGoodbye: how many rounds the sender proposed.
  uint64_t round = 0;
  std::vector<TensorHeader> tensors;  // kRound: the sender's tensors to us.
  absl::Status status;                // kAbort: why (not OK).
};

LinkMessage RoundMessage(uint64_t job, uint64_t round,
                         std::vector<TensorHeader> tensors);
LinkMessage AbortMessage(uint64_t job, const absl::Status& status);
LinkMessage GoodbyeMessage(uint64_t job, uint64_t rounds);

// Encodes a message. Abort messages are truncated to
// kMaxLinkAbortMessageBytes; a kAbort with an OK status is a bug (aborts).
std::string EncodeLinkMessage(const LinkMessage& message);

// Decodes and fully validates a message: the magic (DataLoss), version and
// job (FailedPrecondition), then the kind, reserved bytes, the size the
// preamble implies, each tensor header by DecodeTensorHeader's rules with
// max_tensor_bytes as its limit, and an abort's code, which must be a known
// non-OK code (InvalidArgument). A caller may allocate each header's `bytes`
// once this returns OK.
absl::StatusOr<LinkMessage> DecodeLinkMessage(absl::string_view bytes,
                                              uint64_t expected_job,
                                              uint64_t max_tensor_bytes);

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_NCCL_HEADER_H_
