// Throughput of the TCP data plane over loopback, against the best a plain
// socket does on the same machine in the same run.
//
//   BM_TcpChannel/N:  TcpChannel Send on rank 0, Recv on rank 1, one N MiB
//                     tensor at a time (the receiver allocates each tensor,
//                     as in training).
//   BM_RawSocket/N:   the same byte count per message with blocking
//                     send()/recv() on a connected TCP socket pair, into a
//                     reused buffer: the kernel copies and nothing else.
// The target: TcpChannel at >= 70% of raw bytes_per_second.
//
//   cmake --build build --target transport_benchmark
//   build/bench/transport_benchmark --benchmark_min_time=2
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <semaphore>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "engine/cpu/cpu_backend.h"     // CpuBackend: tensors to send
#include "transport/tcp/tcp_channel.h"  // TcpChannel

namespace conveyor::transport {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kJob = 1;
constexpr int64_t kMiB = 1 << 20;

TcpChannelConfig Config(int rank) {
  TcpChannelConfig config;
  config.rank = rank;
  config.world_size = 2;
  config.job = kJob;
  config.secret = "benchmark";
  return config;
}

void BM_TcpChannel(benchmark::State& state) {
  const int64_t bytes = state.range(0) * kMiB;
  auto* cpu = engine::CpuBackend::Get();
  auto sender = TcpChannel::Create(Config(0), cpu);
  auto receiver = TcpChannel::Create(Config(1), cpu);
  if (!sender.ok() || !receiver.ok()) {
    state.SkipWithError("cannot create the channels");
    return;
  }
  const std::vector<std::string> peers = {
      absl::StrCat("127.0.0.1:", (*sender)->port()),
      absl::StrCat("127.0.0.1:", (*receiver)->port())};
  if (!(*sender)->Connect(peers).ok() || !(*receiver)->Connect(peers).ok()) {
    state.SkipWithError("cannot connect the channels");
    return;
  }
  engine::Tensor tensor = *cpu->Empty({bytes}, engine::DType::kU8);
  std::memset(tensor.raw(), 0x5a, bytes);
  int64_t step = 0;
  for (auto _ : state) {
    const Tag tag{.job = kJob, .step = step++};
    if (!(*sender)->Send(1, tag, tensor).ok()) {
      state.SkipWithError("send failed");
      break;
    }
    auto got = (*receiver)->Recv(tag, 30s);
    if (!got.ok()) {
      state.SkipWithError(std::string(got.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(got->raw());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}
BENCHMARK(BM_TcpChannel)->Arg(4)->Arg(16)->Arg(64)->UseRealTime();

// A connected loopback TCP pair of blocking sockets: {sender, receiver}.
bool SocketPair(int fds[2]) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 ||
      bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return false;
  }
  fds[0] = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fds[0], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return false;
  }
  fds[1] = accept(listener, nullptr, nullptr);
  close(listener);
  return fds[1] >= 0;
}

void BM_RawSocket(benchmark::State& state) {
  const size_t bytes = state.range(0) * kMiB;
  int fds[2];
  if (!SocketPair(fds)) {
    state.SkipWithError("cannot open a loopback socket pair");
    return;
  }
  std::vector<char> out(bytes, 0x5a), in(bytes);
  // One message per iteration, like BM_TcpChannel: the sender starts the
  // next one only when told to.
  std::counting_semaphore<> go(0);
  std::atomic<bool> done{false};
  std::thread sender([&] {
    for (;;) {
      go.acquire();
      if (done.load()) return;
      for (size_t sent = 0; sent < bytes;) {
        const ssize_t n =
            send(fds[0], out.data() + sent, bytes - sent, MSG_NOSIGNAL);
        if (n <= 0) return;
        sent += n;
      }
    }
  });
  for (auto _ : state) {
    go.release();
    for (size_t got = 0; got < bytes;) {
      const ssize_t n = recv(fds[1], in.data() + got, bytes - got, 0);
      if (n <= 0) {
        state.SkipWithError("recv failed");
        break;
      }
      got += n;
    }
    benchmark::DoNotOptimize(in.data());
  }
  done.store(true);
  go.release();
  sender.join();
  close(fds[0]);
  close(fds[1]);
  state.SetBytesProcessed(state.iterations() * bytes);
}
BENCHMARK(BM_RawSocket)->Arg(4)->Arg(16)->Arg(64)->UseRealTime();

}  // namespace
}  // namespace conveyor::transport

BENCHMARK_MAIN();
