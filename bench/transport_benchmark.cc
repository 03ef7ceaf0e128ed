// Throughput of the TCP data plane over loopback, against the best a plain
// socket does on the same machine in the same run. Each iteration moves one
// N MiB message both ways, alternately, and times each separately, so both
// see the same machine load (two separately run benchmarks on a shared
// 2-core machine differed by up to 30% from run to run):
//   tcp: TcpChannel Send on rank 0, Recv on rank 1 (the receiver allocates
//        each tensor, as in training);
//   raw: the same byte count with blocking send()/recv() on a connected TCP
//        socket pair, into a reused buffer: the kernel copies and nothing
//        else.
// The target: TcpChannel at >= 70% of raw.
//
//   cmake --build build --target transport_benchmark
//   build/bench/transport_benchmark --benchmark_min_time=2
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
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

void BM_Transport(benchmark::State& state) {
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

  int fds[2];
  if (!SocketPair(fds)) {
    state.SkipWithError("cannot open a loopback socket pair");
    return;
  }
  std::vector<char> out(bytes, 0x5a), in(bytes);
  // The raw sender starts a message only when told to, like Send.
  std::counting_semaphore<> go(0);
  std::atomic<bool> done{false};
  std::thread raw_sender([&] {
    for (;;) {
      go.acquire();
      if (done.load()) return;
      for (int64_t sent = 0; sent < bytes;) {
        const ssize_t n =
            send(fds[0], out.data() + sent, bytes - sent, MSG_NOSIGNAL);
        if (n <= 0) return;
        sent += n;
      }
    }
  });

  using Clock = std::chrono::steady_clock;
  Clock::duration tcp{}, raw{};
  int64_t step = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
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
    const auto t1 = Clock::now();
    go.release();
    for (int64_t received = 0; received < bytes;) {
      const ssize_t n = recv(fds[1], in.data() + received, bytes - received, 0);
      if (n <= 0) {
        state.SkipWithError("recv failed");
        break;
      }
      received += n;
    }
    benchmark::DoNotOptimize(in.data());
    const auto t2 = Clock::now();
    tcp += t1 - t0;
    raw += t2 - t1;
  }
  done.store(true);
  go.release();
  raw_sender.join();
  close(fds[0]);
  close(fds[1]);
  const double total = static_cast<double>(bytes) * state.iterations();
  state.counters["tcp_GBps"] =
      total / std::chrono::duration<double>(tcp).count() / 1e9;
  state.counters["raw_GBps"] =
      total / std::chrono::duration<double>(raw).count() / 1e9;
}
BENCHMARK(BM_Transport)
    ->Name("transport")
    ->Arg(4)
    ->Arg(16)
    ->Arg(64)
    ->ArgName("MiB")
    ->UseRealTime();

}  // namespace
}  // namespace conveyor::transport

BENCHMARK_MAIN();
