// Serializes the issuing of NCCL operations per device, process-wide.
//
// NCCL forbids issuing operations from several threads at once to
// communicators on the same device (its "Thread Safety" rules), and a worker
// has two kinds: the pipeline channel's communicator, driven by the
// channel's progress thread, and a mesh's communicators (one per device,
// device 0 shared with the channel), driven by the step's thread. Whoever
// issues a group holds the locks of the group's devices from
// ncclGroupStart until the group's operations are launched (a non-blocking
// communicator has left ncclInProgress); completion is not waited for under
// them.
//
// Per device rather than one lock, because ranks in one process (tests run
// two ranks on two GPUs on two threads) must be able to connect to each
// other: a rank waiting under its lock for its peer to join would otherwise
// keep the peer from issuing the matching group.
//
//   NcclLaunchLock lock({device});  // Held until the scope ends.
//
// Thread-safety: that is its purpose. Devices are locked in ascending order,
// so holders of several cannot deadlock each other.
#ifndef CONVEYOR_TRANSPORT_NCCL_NCCL_LAUNCH_LOCK_H_
#define CONVEYOR_TRANSPORT_NCCL_NCCL_LAUNCH_LOCK_H_

#include <vector>

#include "absl/synchronization/mutex.h"

namespace conveyor::transport {

class NcclLaunchLock {
 public:
  // Locks the devices' launch mutexes (duplicates allowed), blocking until
  // all are held.
  explicit NcclLaunchLock(std::vector<int> devices);
  ~NcclLaunchLock();

  NcclLaunchLock(const NcclLaunchLock&) = delete;
  NcclLaunchLock& operator=(const NcclLaunchLock&) = delete;

 private:
  std::vector<absl::Mutex*> held_;  // In the order locked.
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_NCCL_NCCL_LAUNCH_LOCK_H_
