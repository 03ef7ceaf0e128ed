// InMemoryHub: the data plane of one process. Each rank gets a Channel
// endpoint; a send puts the tensor (shared, not copied: senders never modify
// a tensor after sending it) into the receiver's mailbox.
//
// Used to run a whole pipeline in one process (tests, benchmarks) with the
// same executor code the workers run over TCP. Thread-safe.
#ifndef CONVEYOR_TRANSPORT_IN_MEMORY_CHANNEL_H_
#define CONVEYOR_TRANSPORT_IN_MEMORY_CHANNEL_H_

#include <map>
#include <memory>
#include <vector>

#include "transport/channel.h"

namespace conveyor::transport {

class InMemoryHub {
 public:
  explicit InMemoryHub(int ranks);
  ~InMemoryHub();

  // Rank r's endpoint; owned by the hub.
  Channel* endpoint(int rank);

  // Aborts every endpoint (a lost rank fails the whole job).
  void AbortAll(const absl::Status& status);

 private:
  class Endpoint;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_IN_MEMORY_CHANNEL_H_
