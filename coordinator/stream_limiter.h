// StreamLimiter: a cap on long-lived server streams (WatchJob), in all and
// per client host. Unbounded watchers once took every server thread (792
// streams: "Server Threadpool Exhausted" for every other call, worker
// registration included); watches now hold no thread (coordinator/
// watch_hub.h), but each still holds memory and a share of the hub's work,
// so one client must not open without end. A stream past either cap is
// refused at once with RESOURCE_EXHAUSTED.
//
//   std::optional<StreamLimiter::Slot> slot = limiter.Acquire(context->peer());
//   if (!slot) return grpc::Status(RESOURCE_EXHAUSTED, limiter.Refusal(...));
//   // The slot is given back when it goes out of scope.
//
// Thread-safe.
#ifndef CONVEYOR_COORDINATOR_STREAM_LIMITER_H_
#define CONVEYOR_COORDINATOR_STREAM_LIMITER_H_

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"

namespace conveyor::coordinator {

class StreamLimiter {
 public:
  // Holds one stream's place; movable, gives it back on destruction.
  class Slot {
   public:
    Slot(Slot&& other) noexcept;
    Slot& operator=(Slot&&) = delete;
    ~Slot();

   private:
    friend class StreamLimiter;
    Slot(StreamLimiter* limiter, std::string client)
        : limiter_(limiter), client_(std::move(client)) {}
    StreamLimiter* limiter_;
    std::string client_;
  };

  StreamLimiter(int max_total, int max_per_client)
      : max_total_(max_total), max_per_client_(max_per_client) {}

  // A place for a stream from `peer` (gRPC's "ipv4:10.0.0.5:40312"; the
  // port is dropped, so one host's connections share its cap), or nullopt
  // when the host or everyone is at the cap.
  std::optional<Slot> Acquire(absl::string_view peer);

  // Why Acquire refused `peer`, for the RESOURCE_EXHAUSTED status.
  std::string Refusal(absl::string_view peer) const;

  int open() const;

  // "10.0.0.5" for "ipv4:10.0.0.5:40312", "[::1]" for "ipv6:[::1]:5".
  static std::string ClientOf(absl::string_view peer);

 private:
  void Release(const std::string& client);

  const int max_total_;
  const int max_per_client_;
  mutable Mutex mu_;
  int total_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> per_client_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_STREAM_LIMITER_H_
