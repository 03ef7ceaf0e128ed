// P2pChannel over FakeCommunicator (NCCL's matching and rendezvous rules on
// the CPU) and InProcessHeaderHub: the whole NCCL channel protocol (headers,
// rounds, mailbox, timeouts, aborts, closing) without a GPU. The same
// protocol over real NCCL is tests/transport/nccl_channel_test.cc.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/transport/counting_observer.h"
#include "transport/nccl/fake_communicator.h"
#include "transport/nccl/header_link.h"
#include "transport/nccl/p2p_channel.h"

namespace conveyor::transport {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kJob = 9;

Tag T(int32_t mb, int32_t stage, TensorKind kind = TensorKind::kActivation,
      int64_t step = 0) {
  return {.job = kJob,
          .step = step,
          .microbatch = mb,
          .stage = stage,
          .kind = kind};
}

// A CPU tensor whose elements are value, value + 1, ...
engine::Tensor Filled(float value, const engine::Shape& shape = {4, 3}) {
  absl::StatusOr<engine::Tensor> t =
      engine::CpuBackend::Get()->Empty(shape, engine::DType::kF32);
  EXPECT_TRUE(t.ok()) << t.status();
  for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = value + i;
  return *t;
}

// Whether `t` is Filled(value, shape).
::testing::AssertionResult IsFilled(const engine::Tensor& t, float value,
                                    const engine::Shape& shape = {4, 3}) {
  if (t.shape() != shape) {
    return ::testing::AssertionFailure()
           << "shape " << engine::ShapeString(t.shape()) << ", expected "
           << engine::ShapeString(shape);
  }
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.data<float>()[i] != value + i) {
      return ::testing::AssertionFailure()
             << "element " << i << " is " << t.data<float>()[i] << ", expected "
             << value + i;
    }
  }
  return ::testing::AssertionSuccess();
}

bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout = 5s) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// A job of `n` ranks in this process: fake NCCL, in-process header links.
// The hubs are declared first so that the channels go first.
struct Job {
  explicit Job(
      int n,
      const std::function<void(int, P2pChannelOptions*)>& tweak = nullptr)
      : comms(n, engine::CpuBackend::Get()), links(n) {
    for (int r = 0; r < n; ++r) {
      P2pChannelOptions options;
      options.job = kJob;
      options.stall_timeout = 10s;
      options.linger = 5s;
      if (tweak) tweak(r, &options);
      absl::StatusOr<std::unique_ptr<P2pChannel>> channel =
          P2pChannel::Create(comms.Create(r), links.link(r), options);
      EXPECT_TRUE(channel.ok()) << channel.status();
      channels.push_back(channel.ok() ? *std::move(channel) : nullptr);
    }
  }

  P2pChannel* operator[](int r) { return channels[r].get(); }

  FakeCommunicatorHub comms;
  InProcessHeaderHub links;
  std::vector<std::unique_ptr<P2pChannel>> channels;
};

// Runs fn(rank) on one thread per rank and joins them.
void OnEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

// Both ranks send everything first, then receive in reverse order: with
// NCCL's rendezvous, grouping "whatever is pending" would hang here as soon
// as both ranks launch their sends before seeing each other's headers (the
// fake hangs deterministically in that case). Repeated, so that many
// interleavings of the two progress threads are tried.
TEST(P2pChannelTest, ExchangesOutOfOrderInBothDirectionsAtOnce) {
  constexpr int kTensors = 12;
  constexpr int kSteps = 20;
  Job job(2);
  OnEveryRank(2, [&](int rank) {
    const int peer = 1 - rank;
    const TensorKind mine =
        rank == 0 ? TensorKind::kActivation : TensorKind::kGradient;
    const TensorKind theirs =
        rank == 0 ? TensorKind::kGradient : TensorKind::kActivation;
    for (int step = 0; step < kSteps; ++step) {
      for (int mb = 0; mb < kTensors; ++mb) {
        const float value = 1000.0f * rank + 100.0f * step + mb;
        ASSERT_TRUE(job[rank]
                        ->Send(peer, T(mb, rank, mine, step),
                               Filled(value, {mb + 1, 3}))
                        .ok());
      }
      for (int mb = kTensors - 1; mb >= 0; --mb) {
        absl::StatusOr<engine::Tensor> t =
            job[rank]->Recv(T(mb, peer, theirs, step), 10s);
        ASSERT_TRUE(t.ok()) << t.status();
        EXPECT_TRUE(
            IsFilled(*t, 1000.0f * peer + 100.0f * step + mb, {mb + 1, 3}));
      }
    }
  });
  for (int r = 0; r < 2; ++r) {
    // A rank counts its sends when it next polls, maybe after the peer
    // received them.
    EXPECT_TRUE(
        WaitFor([&] { return job[r]->stats().sent == kTensors * kSteps; }));
    const P2pChannel::Stats stats = job[r]->stats();
    EXPECT_EQ(stats.received, kTensors * kSteps);
    EXPECT_GE(stats.rounds, 1);
    EXPECT_LE(stats.groups, stats.rounds);
    EXPECT_TRUE(job[r]->status().ok()) << job[r]->status();
  }
}

// Interleaved pipelines wrap around: rank 3 talks to rank 0. Each rank
// sends to both neighbours and receives in a random order, so groups of
// different pairs interleave on every rank (a single communicator
// serializes them: without agreed rounds, three ranks can wait in a
// cycle).
// NCCL traffic shows in the data-plane metrics as TCP traffic does.
TEST(P2pChannelTest, TellsItsObserverOfEveryTensorAndATimeout) {
  CountingObserver observers[2];
  Job job(2, [&](int r, P2pChannelOptions* options) {
    options->observer = &observers[r];
  });
  constexpr int kTensors = 5;
  uint64_t bytes = 0;
  for (int mb = 0; mb < kTensors; ++mb) {
    ASSERT_TRUE(job[0]->Send(1, T(mb, 0), Filled(mb, {mb + 1, 3})).ok());
    bytes += (mb + 1) * 3 * sizeof(float);
  }
  for (int mb = 0; mb < kTensors; ++mb) {
    ASSERT_TRUE(job[1]->Recv(T(mb, 0), 10s).ok());
  }
  EXPECT_TRUE(WaitFor([&] { return observers[0].Sent()[1] == bytes; }))
      << observers[0].Sent()[1] << " of " << bytes;
  EXPECT_EQ(observers[1].Received()[0], bytes);
  EXPECT_EQ(observers[0].Received()[1], 0u);
  EXPECT_EQ(observers[0].sends, kTensors);
  EXPECT_EQ(observers[0].negative, 0);

  using Error = DataPlaneObserver::Error;
  EXPECT_EQ(job[1]->Recv(T(99, 0), 20ms).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(observers[1].Errors(Error::kTimeout), 1);
  EXPECT_EQ(observers[0].Errors(Error::kTimeout), 0);
}

TEST(P2pChannelTest, RingOfFourWithWraparound) {
  constexpr int kRanks = 4;
  constexpr int kTensors = 10;
  Job job(kRanks, [](int rank, P2pChannelOptions* options) {
    options->peers = {(rank + 1) % kRanks, (rank + kRanks - 1) % kRanks};
  });
  OnEveryRank(kRanks, [&](int rank) {
    const int next = (rank + 1) % kRanks, prev = (rank + kRanks - 1) % kRanks;
    for (int mb = 0; mb < kTensors; ++mb) {
      ASSERT_TRUE(job[rank]
                      ->Send(next, T(mb, rank, TensorKind::kActivation),
                             Filled(rank * 100.0f + mb))
                      .ok());
      ASSERT_TRUE(job[rank]
                      ->Send(prev, T(mb, rank, TensorKind::kGradient),
                             Filled(-rank * 100.0f - mb))
                      .ok());
    }
    std::vector<std::pair<int, TensorKind>> wanted;
    for (int mb = 0; mb < kTensors; ++mb) {
      wanted.push_back({mb, TensorKind::kActivation});  // From prev.
      wanted.push_back({mb, TensorKind::kGradient});    // From next.
    }
    std::shuffle(wanted.begin(), wanted.end(), std::mt19937(rank));
    for (const auto& [mb, kind] : wanted) {
      const bool activation = kind == TensorKind::kActivation;
      const int from = activation ? prev : next;
      absl::StatusOr<engine::Tensor> t =
          job[rank]->Recv(T(mb, from, kind), 10s);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_TRUE(
          IsFilled(*t, activation ? from * 100.0f + mb : -from * 100.0f - mb));
    }
  });
}

// Every rank a peer of every other (the default), all sending at once.
TEST(P2pChannelTest, ThreeRanksAllToAll) {
  constexpr int kRanks = 3;
  Job job(kRanks);
  OnEveryRank(kRanks, [&](int rank) {
    for (int mb = 0; mb < 5; ++mb) {
      for (int to = 0; to < kRanks; ++to) {
        if (to == rank) continue;
        ASSERT_TRUE(job[rank]
                        ->Send(to, T(mb * kRanks + to, rank),
                               Filled(rank * 10.0f + to + mb))
                        .ok());
      }
    }
    for (int mb = 4; mb >= 0; --mb) {
      for (int from = kRanks - 1; from >= 0; --from) {
        if (from == rank) continue;
        absl::StatusOr<engine::Tensor> t =
            job[rank]->Recv(T(mb * kRanks + rank, from), 10s);
        ASSERT_TRUE(t.ok()) << t.status();
        EXPECT_TRUE(IsFilled(*t, from * 10.0f + rank + mb));
      }
    }
  });
}

TEST(P2pChannelTest, CarriesAnyDtypeAndEmptyTensors) {
  Job job(2);
  absl::StatusOr<engine::Tensor> ids =
      engine::CpuBackend::Get()->Empty({3}, engine::DType::kI64);
  ASSERT_TRUE(ids.ok());
  for (int i = 0; i < 3; ++i) ids->data<int64_t>()[i] = (int64_t{1} << 40) + i;
  ASSERT_TRUE(job[0]->Send(1, T(0, 0), *ids).ok());
  ASSERT_TRUE(job[0]->Send(1, T(1, 0), Filled(0, {0, 5})).ok());
  ASSERT_TRUE(job[0]->Send(1, T(2, 0), Filled(7, {})).ok());

  absl::StatusOr<engine::Tensor> empty = job[1]->Recv(T(1, 0), 5s);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->shape(), (engine::Shape{0, 5}));
  absl::StatusOr<engine::Tensor> scalar = job[1]->Recv(T(2, 0), 5s);
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(IsFilled(*scalar, 7, {}));
  absl::StatusOr<engine::Tensor> got = job[1]->Recv(T(0, 0), 5s);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->dtype(), engine::DType::kI64);
  EXPECT_EQ(got->data<int64_t>()[2], (int64_t{1} << 40) + 2);
}

TEST(P2pChannelTest, SendToSelfSharesTheTensor) {
  Job job(2);
  const engine::Tensor t = Filled(3);
  ASSERT_TRUE(job[1]->Send(1, T(0, 1), t).ok());
  absl::StatusOr<engine::Tensor> got = job[1]->Recv(T(0, 1), 1s);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->raw(), t.raw());
  EXPECT_EQ(job.comms.groups_launched(1), 0);
}

TEST(P2pChannelTest, SendRejectsBadArguments) {
  Job job(3, [](int rank, P2pChannelOptions* options) {
    options->max_tensor_bytes = 1024;
    // A line: 0 - 1 - 2.
    options->peers = rank == 1 ? std::vector<int>{0, 2} : std::vector<int>{1};
  });
  P2pChannel* c = job[0];
  auto code = [](const absl::Status& s) { return s.code(); };
  EXPECT_THAT(c->Send(3, T(0, 0), Filled(0)).message(),
              HasSubstr("unknown rank 3"));
  EXPECT_EQ(code(c->Send(-1, T(0, 0), Filled(0))),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c->Send(2, T(0, 0), Filled(0)).message(),
              HasSubstr("not among its peers (1)"));
  Tag other_job = T(0, 0);
  other_job.job = kJob + 1;
  EXPECT_THAT(c->Send(1, other_job, Filled(0)).message(), HasSubstr("in job"));
  EXPECT_THAT(c->Send(1, T(-1, 0), Filled(0)).message(), HasSubstr("negative"));
  EXPECT_THAT(c->Send(1, T(0, 0), engine::Tensor()).message(),
              HasSubstr("undefined"));
  EXPECT_THAT(c->Send(1, T(0, 0), Filled(0, {257})).message(),
              HasSubstr("more than max_tensor_bytes 1024"));
  EXPECT_TRUE(c->status().ok()) << "a refused Send does not abort";
}

TEST(P2pChannelTest, CreateRejectsBadPeerLists) {
  FakeCommunicatorHub comms(3, engine::CpuBackend::Get());
  InProcessHeaderHub links(3);
  for (const std::vector<int>& peers :
       {std::vector<int>{0}, std::vector<int>{3}, std::vector<int>{1, 1},
        std::vector<int>{-1}}) {
    P2pChannelOptions options;
    options.peers = peers;
    absl::StatusOr<std::unique_ptr<P2pChannel>> channel =
        P2pChannel::Create(comms.Create(0), links.link(0), options);
    EXPECT_EQ(channel.status().code(), absl::StatusCode::kInvalidArgument)
        << channel.status();
  }
  EXPECT_EQ(P2pChannel::Create(comms.Create(0), nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(P2pChannelTest, RecvTimesOutAndAbortsTheJob) {
  Job job(2);
  const Clock::time_point start = Clock::now();
  absl::StatusOr<engine::Tensor> t = job[1]->Recv(T(5, 0), 100ms);
  const auto took = Clock::now() - start;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(
      t.status().message(),
      AllOf(HasSubstr("rank 1 waited 100 ms"), HasSubstr("microbatch 5"),
            HasSubstr("no peer has announced it")));
  EXPECT_GE(took, 100ms);
  EXPECT_LT(took, 3s);
  EXPECT_EQ(job[1]->status().code(), absl::StatusCode::kDeadlineExceeded);

  // Rank 0 hears of it over the header link, with the original reason.
  absl::StatusOr<engine::Tensor> other = job[0]->Recv(T(0, 1), 10s);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(other.status().message(),
              AllOf(HasSubstr("rank 0 waiting for"),
                    HasSubstr("rank 1 aborted: rank 1 waited 100 ms")));
  EXPECT_TRUE(WaitFor([&] { return job.comms.aborted(0); }));
  EXPECT_TRUE(WaitFor([&] { return job.comms.aborted(1); }));
  EXPECT_EQ(job[0]->Send(1, T(1, 0), Filled(0)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(P2pChannelTest, RecvTimeoutCanLeaveTheChannelUsable) {
  Job job(2, [](int, P2pChannelOptions* options) {
    options->abort_on_recv_timeout = false;
  });
  EXPECT_EQ(job[1]->Recv(T(0, 0), 20ms).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(job[0]->Send(1, T(0, 0), Filled(1)).ok());
  absl::StatusOr<engine::Tensor> t = job[1]->Recv(T(0, 0), 5s);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(IsFilled(*t, 1));
}

TEST(P2pChannelTest, AbortFailsPendingAndFutureCallsEverywhere) {
  Job job(2);
  absl::StatusOr<engine::Tensor> pending;
  Clock::time_point returned;
  std::thread waiter([&] {
    pending = job[0]->Recv(T(0, 1), 30s);
    returned = Clock::now();
  });
  std::this_thread::sleep_for(50ms);
  const Clock::time_point aborted = Clock::now();
  job[0]->Abort(absl::CancelledError("job 9 cancelled"));
  waiter.join();
  EXPECT_EQ(pending.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(pending.status().message(), HasSubstr("job 9 cancelled"));
  EXPECT_LT(returned - aborted, 2s);
  EXPECT_EQ(job[0]->Send(1, T(0, 0), Filled(0)).code(),
            absl::StatusCode::kCancelled);

  absl::StatusOr<engine::Tensor> peer = job[1]->Recv(T(0, 0), 10s);
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(peer.status().message(),
              HasSubstr("rank 0 aborted: job 9 cancelled"));
  EXPECT_TRUE(WaitFor([&] { return job.comms.aborted(0); }));
}

TEST(P2pChannelTest, CommunicatorErrorFailsTheJob) {
  Job job(2);
  job.comms.InjectError(1, absl::UnavailableError("ncclRemoteError: peer 0"));
  absl::StatusOr<engine::Tensor> t = job[1]->Recv(T(0, 0), 10s);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(t.status().message(),
              AllOf(HasSubstr("rank 1: communicator"),
                    HasSubstr("ncclRemoteError: peer 0")));
  absl::StatusOr<engine::Tensor> peer = job[0]->Recv(T(0, 1), 10s);
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(peer.status().message(), HasSubstr("rank 1 aborted"));
}

TEST(P2pChannelTest, LostHeaderLinkFailsThePeer) {
  Job job(2);
  job.links.Disconnect(1);
  absl::StatusOr<engine::Tensor> t = job[0]->Recv(T(0, 1), 10s);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(t.status().message(),
              HasSubstr("rank 0 lost its header link to rank 1"));
}

// A peer whose device stops (or that died without NCCL noticing): the
// transfer never completes, and the watchdog fails the job naming the peer
// and the tensor, within the stall timeout, even though nobody waits in
// Recv.
TEST(P2pChannelTest, StalledTransferFailsWithinTheStallTimeout) {
  Job job(2, [](int, P2pChannelOptions* options) {
    options->stall_timeout = 200ms;
    options->linger = 100ms;
  });
  job.comms.Freeze(1);
  const Clock::time_point start = Clock::now();
  ASSERT_TRUE(job[0]->Send(1, T(3, 0), Filled(0)).ok());
  ASSERT_TRUE(WaitFor([&] { return !job[0]->status().ok(); }));
  EXPECT_LT(Clock::now() - start, 3s);
  const absl::Status s = job[0]->status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  // Rank 0's send and rank 1's receive stall alike; whichever watchdog
  // fires first fails both ranks.
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("made no progress"), HasSubstr("microbatch 3"),
                    HasSubstr("lost or hung")));
  // The receiver's Recv says the tensor was announced but never arrived.
  absl::StatusOr<engine::Tensor> t = job[1]->Recv(T(3, 0), 5s);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded);
}

// A peer whose progress stopped before it proposed: the round never gets
// its headers.
TEST(P2pChannelTest, MissingProposalFailsWithinTheStallTimeout) {
  FakeCommunicatorHub comms(2, engine::CpuBackend::Get());
  InProcessHeaderHub links(2);
  P2pChannelOptions options;
  options.job = kJob;
  options.stall_timeout = 200ms;
  options.linger = 100ms;
  // Rank 1 exists for NCCL but never starts its channel.
  absl::StatusOr<std::unique_ptr<P2pChannel>> c0 =
      P2pChannel::Create(comms.Create(0), links.link(0), options);
  ASSERT_TRUE(c0.ok());
  ASSERT_TRUE((*c0)->Send(1, T(0, 0), Filled(0)).ok());
  ASSERT_TRUE(WaitFor([&] { return !(*c0)->status().ok(); }));
  EXPECT_EQ((*c0)->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT((*c0)->status().message(),
              HasSubstr("ms for the headers of rank(s) 1"));
}

TEST(P2pChannelTest, ClosingFlushesWhatWasSent) {
  Job job(2);
  for (int mb = 0; mb < 3; ++mb) {
    ASSERT_TRUE(job[0]->Send(1, T(mb, 0), Filled(mb)).ok());
  }
  job.channels[0].reset();  // Flushes, then says goodbye.
  EXPECT_TRUE(job.comms.closed(0));
  for (int mb = 2; mb >= 0; --mb) {
    absl::StatusOr<engine::Tensor> t = job[1]->Recv(T(mb, 0), 5s);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(IsFilled(*t, mb));
  }
  EXPECT_TRUE(job[1]->status().ok()) << "a goodbye is not a failure";
}

TEST(P2pChannelTest, SendToAClosedPeerFails) {
  Job job(2);
  job.channels[1].reset();
  ASSERT_TRUE(job[0]->Send(1, T(0, 0), Filled(0)).ok());  // Queued.
  ASSERT_TRUE(WaitFor([&] { return !job[0]->status().ok(); }));
  EXPECT_EQ(job[0]->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(job[0]->status().message(),
              HasSubstr("to rank 1, which has closed its channel"));
}

TEST(P2pChannelTest, DuplicateTagIsAnInternalError) {
  Job job(2);
  ASSERT_TRUE(job[0]->Send(1, T(0, 0), Filled(0)).ok());
  ASSERT_TRUE(job[0]->Send(1, T(0, 0), Filled(1)).ok());
  ASSERT_TRUE(WaitFor([&] { return !job[1]->status().ok(); }));
  EXPECT_EQ(job[1]->status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(job[1]->status().message(), HasSubstr("twice"));
}

// The header link carries about one message per round and peer: rounds are
// proposed for new sends only, not polled.
TEST(P2pChannelTest, IdleChannelsSendNothing) {
  Job job(2);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(job.links.messages(0, 1), 0);
  EXPECT_EQ(job.links.messages(1, 0), 0);
  ASSERT_TRUE(job[0]->Send(1, T(0, 0), Filled(0)).ok());
  ASSERT_TRUE(job[1]->Recv(T(0, 0), 5s).ok());
  const int64_t rounds = job[0]->stats().rounds;
  EXPECT_GE(rounds, 1);
  EXPECT_EQ(job.links.messages(0, 1), rounds);
  EXPECT_EQ(job.links.messages(1, 0), rounds);
}

}  // namespace
}  // namespace conveyor::transport
