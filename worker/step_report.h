// The StepReport a worker sends the coordinator after each step, from the
// executor's result: one message per rank per step carrying the step's
// figures and its whole timeline (spans), which the coordinator keeps for
// `conveyorctl trace`.
#ifndef CONVEYOR_WORKER_STEP_REPORT_H_
#define CONVEYOR_WORKER_STEP_REPORT_H_

#include "conveyor/v1/conveyor.pb.h"
#include "worker/stage_executor.h"

namespace conveyor::worker {

// Sets report's times, loss, activation peak, start and spans from `result`
// (job id, step and learning rate are the caller's).
void FillStepReport(const RankStepResult& result, v1::StepReport* report);

// Sets report's eval fields from the evaluation that followed the step.
void FillEvalReport(const RankEvalResult& eval, v1::StepReport* report);

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_STEP_REPORT_H_
