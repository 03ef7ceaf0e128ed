#include "proto/protocol.h"

#include "absl/strings/str_cat.h"

namespace conveyor::proto {

void ToProto(const scheduler::Action& action, v1::Action* out) {
  switch (action.op) {
    case scheduler::Op::kForward:
      out->set_op(v1::FORWARD);
      break;
    case scheduler::Op::kBackward:
      out->set_op(v1::BACKWARD);
      break;
    case scheduler::Op::kBackwardInput:
      out->set_op(v1::BACKWARD_INPUT);
      break;
    case scheduler::Op::kBackwardWeight:
      out->set_op(v1::BACKWARD_WEIGHT);
      break;
  }
  out->set_stage(action.stage);
  out->set_microbatch(action.microbatch);
}

absl::StatusOr<std::vector<scheduler::Action>> ActionsFromProto(
    const google::protobuf::RepeatedPtrField<v1::Action>& actions,
    int num_stages) {
  std::vector<scheduler::Action> out;
  out.reserve(actions.size());
  for (int i = 0; i < actions.size(); ++i) {
    const v1::Action& a = actions[i];
    scheduler::Action action;
    switch (a.op()) {
      case v1::FORWARD:
        action.op = scheduler::Op::kForward;
        break;
      case v1::BACKWARD:
        action.op = scheduler::Op::kBackward;
        break;
      case v1::BACKWARD_INPUT:
        action.op = scheduler::Op::kBackwardInput;
        break;
      case v1::BACKWARD_WEIGHT:
        action.op = scheduler::Op::kBackwardWeight;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("action #", i, ": unknown op ", a.op()));
    }
    if (a.stage() < 0 || a.stage() >= num_stages || a.microbatch() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "action #", i, ": stage ", a.stage(), " microbatch ", a.microbatch(),
          " out of range (", num_stages, " stages)"));
    }
    action.stage = a.stage();
    action.microbatch = a.microbatch();
    out.push_back(action);
  }
  return out;
}

absl::string_view JobStateName(v1::JobState state) {
  switch (state) {
    case v1::QUEUED:
      return "QUEUED";
    case v1::PLANNING:
      return "PLANNING";
    case v1::RUNNING:
      return "RUNNING";
    case v1::SUCCEEDED:
      return "SUCCEEDED";
    case v1::FAILED:
      return "FAILED";
    case v1::CANCELLED:
      return "CANCELLED";
    default:
      return "UNKNOWN";
  }
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED ||
         state == v1::CANCELLED;
}

absl::string_view WorkerStateName(v1::WorkerState state) {
  switch (state) {
    case v1::IDLE:
      return "IDLE";
    case v1::BUSY:
      return "BUSY";
    case v1::LOST:
      return "LOST";
    default:
      return "UNKNOWN";
  }
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace conveyor::proto
