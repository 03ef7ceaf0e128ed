// Helpers shared by both ends of the control plane: the protocol version,
// conversions between the schedule library's actions and their wire form,
// and between absl::Status and grpc::Status (whose codes are the same
// numbers, so the mapping is one to one).
// Thread-safe (pure functions).
#ifndef CONVEYOR_PROTO_PROTOCOL_H_
#define CONVEYOR_PROTO_PROTOCOL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "conveyor/v1/conveyor.pb.h"
#include "grpcpp/support/status.h"
#include "scheduler/action.h"

namespace conveyor::proto {

// Bumped on any incompatible change to conveyor.v1's session semantics. A
// worker whose protocol or release version differs from the coordinator's is
// refused at registration.
//   2: checkpoints reported (CheckpointSaved) and resumed (JobProgram
//      resume_*), Deregister. A version-1 worker would ignore resume_step
//      and silently train from scratch, so it must be refused.
inline constexpr int kProtocolVersion = 2;

// Largest control-plane message either end accepts (programs carry the job
// YAML and an action list).
inline constexpr int kMaxMessageBytes = 64 << 20;

void ToProto(const scheduler::Action& action, v1::Action* out);

// InvalidArgument for an unknown op, or a stage outside [0, num_stages) or a
// negative microbatch: a program from a peer is input, not trusted state.
absl::StatusOr<std::vector<scheduler::Action>> ActionsFromProto(
    const google::protobuf::RepeatedPtrField<v1::Action>& actions,
    int num_stages);

// "QUEUED", "RUNNING", ... ; "UNKNOWN" for anything else.
absl::string_view JobStateName(v1::JobState state);
// True for SUCCEEDED, FAILED and CANCELLED.
bool IsTerminal(v1::JobState state);
// "IDLE", "BUSY", "LOST".
absl::string_view WorkerStateName(v1::WorkerState state);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace conveyor::proto

#endif  // CONVEYOR_PROTO_PROTOCOL_H_
