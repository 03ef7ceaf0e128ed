// A DataPlaneObserver that counts what a channel reports, as the worker's
// data-plane metrics do; for the channels' tests.
#ifndef CONVEYOR_TESTS_TRANSPORT_COUNTING_OBSERVER_H_
#define CONVEYOR_TESTS_TRANSPORT_COUNTING_OBSERVER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>

#include "transport/channel.h"

namespace conveyor::transport {

class CountingObserver final : public DataPlaneObserver {
 public:
  void OnSent(int peer, uint64_t bytes,
              std::chrono::steady_clock::duration took) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent[peer] += bytes;
    ++sends;
    if (took < std::chrono::steady_clock::duration::zero()) ++negative;
  }
  void OnReceived(int peer, uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    received[peer] += bytes;
  }
  void OnError(Error error) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++errors[error];
  }
  std::map<int, uint64_t> Sent() {
    std::lock_guard<std::mutex> lock(mu_);
    return sent;
  }
  std::map<int, uint64_t> Received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received;
  }
  int Errors(Error e) {
    std::lock_guard<std::mutex> lock(mu_);
    return errors[e];
  }

  std::mutex mu_;
  std::map<int, uint64_t> sent, received;
  std::map<Error, int> errors;
  int sends = 0;
  int negative = 0;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TESTS_TRANSPORT_COUNTING_OBSERVER_H_
