// TcpHeaderLink: message frames over real TcpChannels on loopback, and the
// NCCL channel's protocol (P2pChannel over FakeCommunicator) running on
// them, as the worker wires it.
#include "transport/tcp/tcp_header_link.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/nccl/fake_communicator.h"
#include "transport/nccl/p2p_channel.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_channel.h"

namespace conveyor::transport {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kJob = 77;

std::vector<std::unique_ptr<TcpChannel>> Connected(int n) {
  std::vector<std::unique_ptr<TcpChannel>> channels;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    TcpChannelConfig config;
    config.rank = r;
    config.world_size = n;
    config.job = kJob;
    config.secret = "header-link-secret";
    config.connect_timeout = 5s;
    auto channel = TcpChannel::Create(config, engine::CpuBackend::Get());
    EXPECT_TRUE(channel.ok()) << channel.status();
    if (!channel.ok()) return {};
    addresses.push_back(absl::StrCat("127.0.0.1:", (*channel)->port()));
    channels.push_back(*std::move(channel));
  }
  for (auto& channel : channels) {
    absl::Status s = channel->Connect(addresses);
    EXPECT_TRUE(s.ok()) << s;
  }
  return channels;
}

// Records what a link delivers.
class Recorder : public HeaderLink::Receiver {
 public:
  void OnMessage(int peer, std::string message) override {
    absl::MutexLock lock(&mu_);
    messages_.emplace_back(peer, std::move(message));
  }
  void OnLinkError(int peer, const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    errors_.emplace_back(peer, status);
  }

  std::vector<std::string> From(int peer) {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& [p, m] : messages_) {
      if (p == peer) out.push_back(m);
    }
    return out;
  }
  std::vector<std::pair<int, absl::Status>> errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }
  bool Await(const std::function<bool(Recorder&)>& done) {
    const Clock::time_point deadline = Clock::now() + 5s;
    while (!done(*this)) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<int, std::string>> messages_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, absl::Status>> errors_ ABSL_GUARDED_BY(mu_);
};

TEST(TcpHeaderLinkTest, MessagesArriveInOrderIncludingThoseBeforeStart) {
  auto channels = Connected(3);
  ASSERT_EQ(channels.size(), 3u);
  TcpHeaderLink link0(channels[0].get(), 0, 3);
  TcpHeaderLink link1(channels[1].get(), 1, 3);
  TcpHeaderLink link2(channels[2].get(), 2, 3);
  std::vector<std::string> from0, from2;
  for (int i = 0; i < 200; ++i) {
    // Sizes up to the limit, so frames of many lengths follow each other.
    from0.push_back(
        std::string(1 + (i * 331) % kMaxMessageBytes, 'a' + i % 26));
    from2.push_back(absl::StrCat("two-", i));
  }
  // How rank 0 hands out the NCCL id: its first message, taken before the
  // link starts; everything after it stays for the link, in order.
  ASSERT_TRUE(channels[0]->SendMessage(1, "the-nccl-id").ok());
  // Half of them before rank 1 starts its link: kept, then delivered first.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(link0.Send(1, from0[i]).ok());
    ASSERT_TRUE(link2.Send(1, from2[i]).ok());
  }
  absl::StatusOr<std::string> id = channels[1]->TakeMessage(0, 5s);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "the-nccl-id");
  std::this_thread::sleep_for(20ms);
  Recorder r1;
  link1.Start(&r1);
  for (int i = 100; i < 200; ++i) {
    ASSERT_TRUE(link0.Send(1, from0[i]).ok());
    ASSERT_TRUE(link2.Send(1, from2[i]).ok());
  }
  ASSERT_TRUE(r1.Await([](Recorder& r) {
    return r.From(0).size() == 200 && r.From(2).size() == 200;
  }));
  EXPECT_THAT(r1.From(0), ElementsAreArray(from0));
  EXPECT_THAT(r1.From(2), ElementsAreArray(from2));
  EXPECT_TRUE(r1.errors().empty());
  link1.Stop();
}

TEST(TcpHeaderLinkTest, TakeMessageTimesOutOrReportsTheFailure) {
  auto channels = Connected(2);
  ASSERT_EQ(channels.size(), 2u);
  absl::StatusOr<std::string> none = channels[1]->TakeMessage(0, 50ms);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(none.status().message(),
              HasSubstr("waited 50 ms for a message from rank 0"));
  // Rank 0 fails before sending its id: rank 1 hears why, at once.
  std::thread fail([&] {
    std::this_thread::sleep_for(50ms);
    channels[0]->Abort(absl::UnavailableError("rank 0 has no NCCL id"));
  });
  const Clock::time_point start = Clock::now();
  absl::StatusOr<std::string> failed = channels[1]->TakeMessage(0, 10s);
  fail.join();
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_THAT(failed.status().message(), HasSubstr("rank 0 has no NCCL id"));
}

TEST(TcpHeaderLinkTest, RefusesOversizedMessagesAndMessagesToItself) {
  auto channels = Connected(2);
  ASSERT_EQ(channels.size(), 2u);
  TcpHeaderLink link(channels[0].get(), 0, 2);
  absl::Status big = link.Send(1, std::string(kMaxMessageBytes + 1, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("at most 65536"));
  EXPECT_EQ(link.Send(0, "self").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(link.Send(2, "nobody").code(), absl::StatusCode::kInvalidArgument);
}

// A failed channel (here a peer's abort) breaks the link to every peer, with
// the reason; sending afterwards says the link is broken.
TEST(TcpHeaderLinkTest, AChannelFailureBreaksTheLinkToEveryPeer) {
  auto channels = Connected(3);
  ASSERT_EQ(channels.size(), 3u);
  TcpHeaderLink link1(channels[1].get(), 1, 3);
  Recorder r1;
  link1.Start(&r1);
  channels[0]->Abort(absl::InternalError("rank 0's device failed"));
  ASSERT_TRUE(r1.Await([](Recorder& r) { return r.errors().size() == 2; }));
  std::vector<std::pair<int, absl::Status>> errors = r1.errors();
  EXPECT_EQ(errors[0].first, 0);
  EXPECT_EQ(errors[1].first, 2);
  for (const auto& [peer, status] : errors) {
    // The aborting rank's code, not a generic "unavailable".
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(status.message(), HasSubstr("rank 0's device failed"));
  }
  absl::Status s = link1.Send(2, "late");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("header link to rank 2 is broken"));
  link1.Stop();
}

// Two ranks closing together: a header (say a round proposal) sent to a
// peer that already said goodbye is dropped, as HeaderLink promises, and
// does not fail the sender's channel (which would abort its other peers).
TEST(TcpHeaderLinkTest, MessagesToAPeerThatClosedAreDroppedNotAnError) {
  auto channels = Connected(2);
  ASSERT_EQ(channels.size(), 2u);
  channels[1].reset();  // Flushes, says goodbye, closes.
  std::this_thread::sleep_for(200ms);
  TcpHeaderLink link(channels[0].get(), 0, 2);
  EXPECT_TRUE(link.Send(1, "late proposal").ok());
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(channels[0]->status().ok()) << channels[0]->status();
}

engine::Tensor Filled(float value, int64_t rows) {
  engine::Tensor t =
      *engine::CpuBackend::Get()->Empty({rows, 3}, engine::DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value + i;
  return t;
}

// Two ranks as the worker wires them without a GPU: P2pChannels (the NCCL
// channel's protocol) over FakeCommunicator, announcing tensors over
// TcpHeaderLinks on connected TcpChannels. Members go in reverse: channels
// before their links, links before the TCP channels carrying them.
struct NcclOverTcp {
  NcclOverTcp(std::chrono::milliseconds stall, std::chrono::milliseconds linger)
      : channels(Connected(2)), comms(2, engine::CpuBackend::Get()) {
    if (channels.size() != 2) return;
    for (int r = 0; r < 2; ++r) {
      links.push_back(std::make_unique<TcpHeaderLink>(channels[r].get(), r, 2));
      P2pChannelOptions options;
      options.job = kJob;
      options.stall_timeout = stall;
      options.linger = linger;
      auto channel =
          P2pChannel::Create(comms.Create(r), links[r].get(), options);
      EXPECT_TRUE(channel.ok()) << channel.status();
      if (!channel.ok()) return;
      p2p.push_back(*std::move(channel));
    }
  }
  bool ok() const { return p2p.size() == 2; }

  std::vector<std::unique_ptr<TcpChannel>> channels;
  FakeCommunicatorHub comms;
  std::vector<std::unique_ptr<TcpHeaderLink>> links;
  std::vector<std::unique_ptr<P2pChannel>> p2p;
};

// The worker's wiring without a GPU: P2pChannels (the NCCL channel's
// protocol) over FakeCommunicator, announcing tensors over TcpHeaderLinks.
// Both ranks send everything before receiving in reverse order.
TEST(TcpHeaderLinkTest, CarriesTheNcclProtocolBetweenTwoRanks) {
  NcclOverTcp job(10s, 5s);
  ASSERT_TRUE(job.ok());
  auto& p2p = job.p2p;
  constexpr int kTensors = 16;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      const int peer = 1 - rank;
      const TensorKind mine =
          rank == 0 ? TensorKind::kActivation : TensorKind::kGradient;
      const TensorKind theirs =
          rank == 0 ? TensorKind::kGradient : TensorKind::kActivation;
      for (int mb = 0; mb < kTensors; ++mb) {
        const Tag tag = {.job = kJob,
                         .step = 1,
                         .microbatch = mb,
                         .stage = rank,
                         .kind = mine};
        ASSERT_TRUE(p2p[rank]
                        ->Send(peer, tag, Filled(1000.0f * rank + mb, mb + 1))
                        .ok());
      }
      for (int mb = kTensors - 1; mb >= 0; --mb) {
        const Tag tag = {.job = kJob,
                         .step = 1,
                         .microbatch = mb,
                         .stage = peer,
                         .kind = theirs};
        absl::StatusOr<engine::Tensor> got = p2p[rank]->Recv(tag, 10s);
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_EQ(got->dim(0), mb + 1);
        for (int64_t i = 0; i < got->numel(); ++i) {
          ASSERT_EQ(got->data<float>()[i], 1000.0f * peer + mb + i);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// A rank whose TCP channel fails (its process died, in effect) cannot
// leave its peer waiting on the NCCL protocol: the peer's Recv fails with
// the link error long before its timeout.
TEST(TcpHeaderLinkTest, APeersChannelFailureFailsAPendingRecvPromptly) {
  NcclOverTcp job(30s, 1s);
  ASSERT_TRUE(job.ok());
  auto& p2p = job.p2p;
  auto& channels = job.channels;
  std::thread killer([&] {
    std::this_thread::sleep_for(100ms);
    channels[0]->Abort(absl::ResourceExhaustedError("rank 0 went away"));
  });
  const Clock::time_point start = Clock::now();
  const Tag tag = {.job = kJob,
                   .step = 1,
                   .microbatch = 0,
                   .stage = 0,
                   .kind = TensorKind::kActivation};
  absl::StatusOr<engine::Tensor> got = p2p[1]->Recv(tag, 30s);
  killer.join();
  EXPECT_FALSE(got.ok());
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_THAT(got.status().message(), HasSubstr("rank 0 went away"));
  // Rank 0's code reaches its peer: a policy reading codes sees the cause.
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace conveyor::transport
