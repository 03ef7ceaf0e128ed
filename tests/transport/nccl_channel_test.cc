// NcclChannel on real GPUs: two ranks in one process (one thread each, each
// on its own GPU, since NCCL refuses two ranks on one GPU), header messages
// over an InProcessHeaderHub. Tests that need GPUs skip themselves when the
// machine has fewer; the option checks run everywhere. The protocol itself
// is tested without GPUs in nccl_p2p_channel_test.cc.
#include "transport/nccl/nccl_channel.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/nccl/header_link.h"

namespace conveyor::transport {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kJob = 11;

int GpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

#define SKIP_WITHOUT_GPUS(n)                                             \
  do {                                                                   \
    if (const int have = GpuCount(); have < (n)) {                       \
      GTEST_SKIP() << "needs " << (n)                                    \
                   << " CUDA device(s), one per rank (NCCL refuses two " \
                   << "ranks on one GPU); this machine has " << have;    \
    }                                                                    \
  } while (false)

Tag T(int32_t mb, int32_t stage, TensorKind kind = TensorKind::kActivation) {
  return {
      .job = kJob, .step = 0, .microbatch = mb, .stage = stage, .kind = kind};
}

NcclChannelOptions Options(int rank, int world_size, const std::string& id,
                           HeaderLink* link, engine::CudaBackend* backend) {
  NcclChannelOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.device = backend != nullptr ? backend->device() : rank;
  options.unique_id = id;
  options.job = kJob;
  options.header_link = link;
  options.backend = backend;
  options.init_timeout = 60s;
  options.stall_timeout = 30s;
  options.linger = 10s;
  return options;
}

// A device tensor holding value, value + 1, ... (n floats).
engine::Tensor DeviceFilled(engine::CudaBackend* cuda, float value, int64_t n) {
  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i)
    host[i] = value + static_cast<float>(i % 4096);
  absl::StatusOr<engine::Tensor> t = cuda->Empty({n}, engine::DType::kF32);
  EXPECT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(cuda->CopyFromHost(host.data(), host.size() * 4, *t).ok());
  return *t;
}

::testing::AssertionResult HoldsFilled(const engine::Tensor& t, float value,
                                       int64_t n) {
  if (t.numel() != n) {
    return ::testing::AssertionFailure() << t.numel() << " elements, not " << n;
  }
  std::vector<float> host(n);
  const absl::Status s = t.backend()->CopyToHost(t, host.data(), n * 4);
  if (!s.ok()) return ::testing::AssertionFailure() << s;
  for (int64_t i = 0; i < n; ++i) {
    if (host[i] != value + static_cast<float>(i % 4096)) {
      return ::testing::AssertionFailure()
             << "element " << i << " is " << host[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs fn(rank, backend) on one thread per rank, rank r on GPU r.
void OnEveryGpu(int n,
                const std::function<void(int, engine::CudaBackend*)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([r, &fn] {
      absl::StatusOr<std::unique_ptr<engine::CudaBackend>> cuda =
          engine::CudaBackend::Create(r);
      ASSERT_TRUE(cuda.ok()) << cuda.status();
      fn(r, cuda->get());
    });
  }
  for (std::thread& t : threads) t.join();
}

// Runs fn(rank, backend, channel) on one thread per rank, rank r on GPU r,
// each with a channel of an n-rank communicator joined through in-process
// header links. The channel closes before its backend goes.
void OnEveryChannel(
    int n,
    const std::function<void(int, engine::CudaBackend*, NcclChannel*)>& fn) {
  absl::StatusOr<std::string> id = CreateNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  InProcessHeaderHub links(n);
  OnEveryGpu(n, [&](int rank, engine::CudaBackend* cuda) {
    absl::StatusOr<std::unique_ptr<NcclChannel>> channel =
        NcclChannel::Create(Options(rank, n, *id, links.link(rank), cuda));
    ASSERT_TRUE(channel.ok()) << channel.status();
    fn(rank, cuda, channel->get());
    channel->reset();
  });
}

TEST(NcclChannelTest, UniqueIdHasNcclSize) {
  absl::StatusOr<std::string> id = CreateNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), kNcclUniqueIdBytes);
  absl::StatusOr<std::string> other = CreateNcclUniqueId();
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(*id, *other);
}

TEST(NcclChannelTest, CreateRejectsBadOptions) {
  InProcessHeaderHub links(2);
  const std::string id(kNcclUniqueIdBytes, 'x');
  // None of these gets as far as touching a GPU.
  NcclChannelOptions no_backend = Options(0, 2, id, links.link(0), nullptr);
  EXPECT_THAT(NcclChannel::Create(no_backend).status().message(),
              HasSubstr("needs a header link and a CUDA backend"));
  NcclChannelOptions short_id = no_backend;
  short_id.unique_id = "abc";
  EXPECT_THAT(NcclChannel::Create(short_id).status().message(),
              HasSubstr("has 3 bytes, not 128"));
  NcclChannelOptions bad_rank = no_backend;
  bad_rank.rank = 2;
  EXPECT_EQ(NcclChannel::Create(bad_rank).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclChannelTest, SingleRankCommunicatorWorks) {
  SKIP_WITHOUT_GPUS(1);
  OnEveryChannel(1, [&](int, engine::CudaBackend* cuda, NcclChannel* channel) {
    ASSERT_TRUE(channel->Send(0, T(0, 0), DeviceFilled(cuda, 5, 100)).ok());
    absl::StatusOr<engine::Tensor> t = channel->Recv(T(0, 0), 5s);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(HoldsFilled(*t, 5, 100));
  });
}

// Rank 1 never calls Create: rank 0 must give up at the init timeout,
// not hang.
TEST(NcclChannelTest, InitTimesOutWhenAPeerNeverJoins) {
  SKIP_WITHOUT_GPUS(1);
  absl::StatusOr<std::string> id = CreateNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  InProcessHeaderHub links(2);
  OnEveryGpu(1, [&](int rank, engine::CudaBackend* cuda) {
    NcclChannelOptions options = Options(rank, 2, *id, links.link(rank), cuda);
    options.init_timeout = 2s;
    const Clock::time_point start = Clock::now();
    absl::StatusOr<std::unique_ptr<NcclChannel>> channel =
        NcclChannel::Create(options);
    const auto took = Clock::now() - start;
    EXPECT_EQ(channel.status().code(), absl::StatusCode::kDeadlineExceeded)
        << channel.status();
    EXPECT_THAT(channel.status().message(), HasSubstr("did not join"));
    EXPECT_GE(took, 2s);
    EXPECT_LT(took, 30s);
  });
}

// The deadlock case: both ranks send large tensors (beyond NCCL's internal
// buffers, so a send is a true rendezvous) before receiving, then receive
// in reverse order, in both directions at once. Also a CPU tensor, which is
// copied to the device, and an empty one.
TEST(NcclChannelTest, ExchangesOutOfOrderInBothDirectionsAtOnce) {
  SKIP_WITHOUT_GPUS(2);
  constexpr int kTensors = 8;
  constexpr int64_t kBig = int64_t{4} << 20;  // 16 MiB of floats.
  OnEveryChannel(
      2, [&](int rank, engine::CudaBackend* cuda, NcclChannel* channel) {
        const int peer = 1 - rank;
        const TensorKind mine =
            rank == 0 ? TensorKind::kActivation : TensorKind::kGradient;
        const TensorKind theirs =
            rank == 0 ? TensorKind::kGradient : TensorKind::kActivation;
        for (int mb = 0; mb < kTensors; ++mb) {
          const int64_t n = mb % 2 == 0 ? kBig : 1000 + mb;
          ASSERT_TRUE(channel
                          ->Send(peer, T(mb, rank, mine),
                                 DeviceFilled(cuda, 1000.0f * rank + mb, n))
                          .ok());
        }
        absl::StatusOr<engine::Tensor> host =
            engine::CpuBackend::Get()->Empty({3}, engine::DType::kF32);
        ASSERT_TRUE(host.ok());
        for (int i = 0; i < 3; ++i) host->data<float>()[i] = 7.0f + i;
        ASSERT_TRUE(channel->Send(peer, T(100, rank, mine), *host).ok());
        absl::StatusOr<engine::Tensor> empty =
            cuda->Empty({0, 4}, engine::DType::kF32);
        ASSERT_TRUE(empty.ok());
        ASSERT_TRUE(channel->Send(peer, T(101, rank, mine), *empty).ok());

        for (int mb = kTensors - 1; mb >= 0; --mb) {
          const int64_t n = mb % 2 == 0 ? kBig : 1000 + mb;
          absl::StatusOr<engine::Tensor> t =
              channel->Recv(T(mb, peer, theirs), 30s);
          ASSERT_TRUE(t.ok()) << t.status();
          EXPECT_EQ(t->backend(), cuda);
          EXPECT_TRUE(HoldsFilled(*t, 1000.0f * peer + mb, n));
        }
        absl::StatusOr<engine::Tensor> from_host =
            channel->Recv(T(100, peer, theirs), 30s);
        ASSERT_TRUE(from_host.ok()) << from_host.status();
        EXPECT_TRUE(HoldsFilled(*from_host, 7, 3));
        absl::StatusOr<engine::Tensor> got_empty =
            channel->Recv(T(101, peer, theirs), 30s);
        ASSERT_TRUE(got_empty.ok()) << got_empty.status();
        EXPECT_EQ(got_empty->shape(), (engine::Shape{0, 4}));
        EXPECT_TRUE(channel->status().ok()) << channel->status();
      });
}

TEST(NcclChannelTest, RecvTimesOutWhenThePeerNeverSends) {
  SKIP_WITHOUT_GPUS(2);
  OnEveryChannel(2, [&](int rank, engine::CudaBackend*, NcclChannel* channel) {
    if (rank == 1) {
      const Clock::time_point start = Clock::now();
      absl::StatusOr<engine::Tensor> t = channel->Recv(T(0, 0), 200ms);
      const auto took = Clock::now() - start;
      EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded);
      EXPECT_THAT(t.status().message(), HasSubstr("rank 1 waited 200 ms"));
      EXPECT_LT(took, 5s);
    } else {
      // Rank 0 sends nothing and learns of rank 1's failure.
      absl::StatusOr<engine::Tensor> t = channel->Recv(T(0, 1), 30s);
      EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded);
      EXPECT_THAT(t.status().message(), HasSubstr("rank 1 aborted"));
    }
  });
}

TEST(NcclChannelTest, AbortFailsAPendingRecvOnBothRanks) {
  SKIP_WITHOUT_GPUS(2);
  OnEveryChannel(2, [&](int rank, engine::CudaBackend*, NcclChannel* channel) {
    if (rank == 0) {
      std::thread aborter([&] {
        std::this_thread::sleep_for(100ms);
        channel->Abort(absl::CancelledError("job 11 cancelled"));
      });
      const Clock::time_point start = Clock::now();
      absl::StatusOr<engine::Tensor> t = channel->Recv(T(0, 1), 30s);
      aborter.join();
      EXPECT_EQ(t.status().code(), absl::StatusCode::kCancelled);
      EXPECT_LT(Clock::now() - start, 5s);
    } else {
      absl::StatusOr<engine::Tensor> t = channel->Recv(T(0, 0), 30s);
      EXPECT_EQ(t.status().code(), absl::StatusCode::kCancelled);
      EXPECT_THAT(t.status().message(),
                  HasSubstr("rank 0 aborted: job 11 cancelled"));
    }
  });
}

}  // namespace
}  // namespace conveyor::transport
