// ChooseDataPlane: whether a job's tensors travel over NCCL or TCP, from
// what every rank reported in JobReady. The coordinator decides once, so all
// ranks agree (a rank on NCCL and its neighbour on TCP would wait forever),
// and the choice and its reason are shown as the job's data_plane.
//
// NCCL needs every rank on a GPU of its own: it refuses two ranks on one
// GPU and cannot reach a CPU rank. Otherwise the job stays on TCP, which
// stages device tensors through host memory.
#ifndef CONVEYOR_COORDINATOR_DATA_PLANE_CHOICE_H_
#define CONVEYOR_COORDINATOR_DATA_PLANE_CHOICE_H_

#include <string>
#include <vector>

#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

struct DataPlaneChoice {
  bool nccl = false;  // StartJob.nccl; false: TCP.
  // "nccl", or "tcp (why not NCCL)", for Job.data_plane and the log.
  std::string description;
};

// `ready[r]` is rank r's JobReady.
DataPlaneChoice ChooseDataPlane(const std::vector<v1::JobReady>& ready);

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_DATA_PLANE_CHOICE_H_
