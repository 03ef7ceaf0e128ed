// What crosses a pipeline stage boundary under a job's precision.
//
// Under `training.precision: bf16` a stage's output activations and the
// gradients sent back for them travel as bfloat16: half the point-to-point
// bytes on TCP and NCCL alike, as pipelines trained under autocast send
// them. The receiving stage widens them to f32 (exactly) and computes as
// before, so what bf16 changes is one rounding of each boundary tensor
// (relative error at most 2^-9, ties to even), the same in every executor:
// the in-process trainer passes its boundary tensors through the same
// rounding (ThroughBoundary), so a pipelined run and the in-process
// reference stay bit for bit equal. Under fp32 nothing changes.
//
// Each function works on the tensor's own backend (a received tensor may
// live on the host while the stage's device is a GPU).
//
// Thread-safe as the tensor's backend is.
#ifndef CONVEYOR_ENGINE_BOUNDARY_PRECISION_H_
#define CONVEYOR_ENGINE_BOUNDARY_PRECISION_H_

#include "absl/status/statusor.h"
#include "engine/precision.h"
#include "engine/tensor.h"

namespace conveyor::engine {

// The tensor to send for `t`: a BF16 copy under kBf16 when `t` is F32;
// otherwise `t` itself.
absl::StatusOr<Tensor> ToBoundary(const Tensor& t, Precision precision);

// A received tensor as the stage computes with it: a BF16 one widened to a
// new F32 tensor; any other as it is.
absl::StatusOr<Tensor> FromBoundary(const Tensor& t);

// FromBoundary(ToBoundary(t)): what the next stage computes with.
absl::StatusOr<Tensor> ThroughBoundary(const Tensor& t, Precision precision);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_BOUNDARY_PRECISION_H_
