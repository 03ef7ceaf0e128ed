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
// latency/idle_ms:4: a 4-byte tensor sent after the ranks idled 4 ms, as a
// pipeline's critical path pays once per transfer (threads that slept for
// milliseconds wake slowly), against a raw socket ping-pong after the same
// idling in the same run: one thread writes 4 bytes, an echo thread blocked
// in recv() sends them back, and the writer, blocked in recv(), reads them.
// Medians of both and their ratio (target: TcpChannel within 2x).
//
//   cmake --build build --target transport_benchmark
//   build/bench/transport_benchmark --benchmark_min_time=2
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
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

// Rank 0 and rank 1 of a job, connected over loopback; empty (with the
// benchmark skipped) when that fails.
std::vector<std::unique_ptr<TcpChannel>> ConnectedPair(
    benchmark::State& state) {
  auto* cpu = engine::CpuBackend::Get();
  auto sender = TcpChannel::Create(Config(0), cpu);
  auto receiver = TcpChannel::Create(Config(1), cpu);
  if (!sender.ok() || !receiver.ok()) {
    state.SkipWithError("cannot create the channels");
    return {};
  }
  const std::vector<std::string> peers = {
      absl::StrCat("127.0.0.1:", (*sender)->port()),
      absl::StrCat("127.0.0.1:", (*receiver)->port())};
  if (!(*sender)->Connect(peers).ok() || !(*receiver)->Connect(peers).ok()) {
    state.SkipWithError("cannot connect the channels");
    return {};
  }
  std::vector<std::unique_ptr<TcpChannel>> pair;
  pair.push_back(*std::move(sender));
  pair.push_back(*std::move(receiver));
  return pair;
}

void BM_Transport(benchmark::State& state) {
  const int64_t bytes = state.range(0) * kMiB;
  auto* cpu = engine::CpuBackend::Get();
  std::vector<std::unique_ptr<TcpChannel>> pair = ConnectedPair(state);
  if (pair.empty()) return;
  TcpChannel* sender = pair[0].get();
  TcpChannel* receiver = pair[1].get();
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
    if (!sender->Send(1, tag, tensor).ok()) {
      state.SkipWithError("send failed");
      break;
    }
    auto got = receiver->Recv(tag, 30s);
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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void BM_LatencyAfterIdle(benchmark::State& state) {
  const auto idle = std::chrono::milliseconds(state.range(0));
  auto* cpu = engine::CpuBackend::Get();
  std::vector<std::unique_ptr<TcpChannel>> pair = ConnectedPair(state);
  if (pair.empty()) return;
  TcpChannel* sender = pair[0].get();
  TcpChannel* receiver = pair[1].get();
  engine::Tensor probe = *cpu->Zeros({1}, engine::DType::kF32);
  int fds[2];
  if (!SocketPair(fds)) {
    state.SkipWithError("cannot open a loopback socket pair");
    return;
  }
  for (int fd : fds) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  // Echoes every 4 bytes back until the socket closes.
  std::thread echo([fd = fds[1]] {
    char buf[4];
    for (;;) {
      if (recv(fd, buf, sizeof(buf), MSG_WAITALL) != sizeof(buf)) return;
      if (send(fd, buf, sizeof(buf), MSG_NOSIGNAL) != sizeof(buf)) return;
    }
  });

  using Clock = std::chrono::steady_clock;
  std::vector<double> tcp_us, raw_us;
  int64_t step = 0;
  for (auto _ : state) {
    std::this_thread::sleep_for(idle);
    const Tag tag{.job = kJob, .step = step++};
    const auto t0 = Clock::now();
    if (!sender->Send(1, tag, probe).ok() || !receiver->Recv(tag, 10s).ok()) {
      state.SkipWithError("the probe did not arrive");
      break;
    }
    tcp_us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());

    std::this_thread::sleep_for(idle);
    char buf[4] = {1, 2, 3, 4};
    const auto t1 = Clock::now();
    if (send(fds[0], buf, sizeof(buf), MSG_NOSIGNAL) != sizeof(buf) ||
        recv(fds[0], buf, sizeof(buf), MSG_WAITALL) != sizeof(buf)) {
      state.SkipWithError("the ping-pong failed");
      break;
    }
    raw_us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t1).count());
  }
  shutdown(fds[0], SHUT_RDWR);
  echo.join();
  close(fds[0]);
  close(fds[1]);
  const double tcp = Median(tcp_us), raw = Median(raw_us);
  state.counters["tcp_us"] = tcp;
  state.counters["raw_pingpong_us"] = raw;
  state.counters["ratio"] = raw > 0 ? tcp / raw : 0;
}
BENCHMARK(BM_LatencyAfterIdle)
    ->Name("latency")
    ->Arg(4)
    ->ArgName("idle_ms")
    ->Iterations(200)
    ->UseRealTime();

}  // namespace
}  // namespace conveyor::transport

BENCHMARK_MAIN();
