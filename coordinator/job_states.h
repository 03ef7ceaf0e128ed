// The moves a job makes between its states, as the coordinator drives them:
//
//   QUEUED --placed--> PLANNING --every rank ready--> RUNNING --> SUCCEEDED
//   QUEUED, PLANNING, RUNNING --> FAILED or CANCELLED
//   PLANNING, RUNNING --restart (a lost worker, max_restarts)--> QUEUED
//
// SUCCEEDED, FAILED and CANCELLED are final. JobManager checks every move it
// makes against this table (an invariant: a move outside it is a bug in
// the coordinator, never something a client or a worker can cause).
//
// Thread-safe (pure functions).
#ifndef CONVEYOR_COORDINATOR_JOB_STATES_H_
#define CONVEYOR_COORDINATOR_JOB_STATES_H_

#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

// Whether a job may move from `from` to `to`.
bool CanMoveJob(v1::JobState from, v1::JobState to);

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_JOB_STATES_H_
