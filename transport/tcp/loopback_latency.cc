#include "transport/tcp/loopback_latency.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "transport/tcp/tcp_channel.h"

namespace conveyor::transport {

absl::StatusOr<double> MeasureLoopbackLatency(engine::Backend* backend,
                                              int samples,
                                              std::chrono::milliseconds idle) {
  if (samples < 1 || samples > 1000 || idle.count() < 0 || idle.count() > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("loopback latency: samples ", samples, " (1..1000), idle ",
                     idle.count(), " ms (0..100)"));
  }
  std::unique_ptr<TcpChannel> ranks[2];
  std::vector<std::string> peers;
  for (int r = 0; r < 2; ++r) {
    ASSIGN_OR_RETURN(ranks[r],
                     TcpChannel::Create({.rank = r,
                                         .world_size = 2,
                                         .listen_address = "127.0.0.1:0",
                                         .job = 1,
                                         .secret = "loopback"},
                                        backend));
    peers.push_back(absl::StrCat("127.0.0.1:", ranks[r]->port()));
  }
  // Each rank dials the other and accepts it: both at once.
  absl::Status second;
  std::thread connect([&] { second = ranks[1]->Connect(peers); });
  absl::Status first = ranks[0]->Connect(peers);
  connect.join();
  RETURN_IF_ERROR(first);
  RETURN_IF_ERROR(second);
  ASSIGN_OR_RETURN(engine::Tensor probe,
                   backend->Zeros({1}, engine::DType::kF32));
  std::vector<double> seconds;
  seconds.reserve(samples);
  for (int i = 0; i < samples; ++i) {
    std::this_thread::sleep_for(idle);
    const Tag tag{.job = 1, .step = i};
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(ranks[0]->Send(1, tag, probe));
    RETURN_IF_ERROR(ranks[1]->Recv(tag, std::chrono::seconds(10)).status());
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + samples / 2,
                   seconds.end());
  return seconds[samples / 2];
}

}  // namespace conveyor::transport
