// The fake must keep NCCL's rules strictly, or the P2pChannel tests that run
// on it prove nothing: in particular, it must hang where NCCL can hang.
#include <cstring>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "transport/nccl/fake_communicator.h"

namespace conveyor::transport {
namespace {

engine::Tensor Filled(float value, int64_t n = 4) {
  absl::StatusOr<engine::Tensor> t =
      engine::CpuBackend::Get()->Empty({n}, engine::DType::kF32);
  EXPECT_TRUE(t.ok());
  for (int64_t i = 0; i < n; ++i) t->data<float>()[i] = value + i;
  return *t;
}

bool Done(CommunicatorInterface* comm, uint64_t id) {
  absl::StatusOr<bool> done = comm->Poll(id);
  EXPECT_TRUE(done.ok()) << done.status();
  return done.ok() && *done;
}

TEST(FakeCommunicatorTest, GroupedSendAndReceiveComplete) {
  FakeCommunicatorHub hub(2, engine::CpuBackend::Get());
  auto a = hub.Create(0), b = hub.Create(1);
  engine::Tensor a_out = Filled(1), b_out = Filled(10);
  engine::Tensor a_in = Filled(0), b_in = Filled(0);
  absl::StatusOr<uint64_t> ga = a->Launch({SendOp(1, a_out), RecvOp(1, a_in)});
  ASSERT_TRUE(ga.ok());
  EXPECT_FALSE(Done(a.get(), *ga));  // Rendezvous: b has not posted yet.
  absl::StatusOr<uint64_t> gb = b->Launch({RecvOp(0, b_in), SendOp(0, b_out)});
  ASSERT_TRUE(gb.ok());
  EXPECT_TRUE(Done(a.get(), *ga));
  EXPECT_TRUE(Done(b.get(), *gb));
  EXPECT_EQ(a_in.data<float>()[3], 13.0f);
  EXPECT_EQ(b_in.data<float>()[3], 4.0f);
}

// The hang the P2pChannel's rounds exist to prevent: each rank runs a group
// whose send waits for a receive the other rank queued behind it.
TEST(FakeCommunicatorTest, CrossingSendsInSeparateGroupsHang) {
  FakeCommunicatorHub hub(2, engine::CpuBackend::Get());
  auto a = hub.Create(0), b = hub.Create(1);
  engine::Tensor a_in = Filled(0), b_in = Filled(0);
  const uint64_t a_send = *a->Launch({SendOp(1, Filled(1))});
  const uint64_t b_send = *b->Launch({SendOp(0, Filled(2))});
  const uint64_t a_recv = *a->Launch({RecvOp(1, a_in)});
  const uint64_t b_recv = *b->Launch({RecvOp(0, b_in)});
  for (uint64_t id : {a_send, a_recv}) EXPECT_FALSE(Done(a.get(), id));
  for (uint64_t id : {b_send, b_recv}) EXPECT_FALSE(Done(b.get(), id));
}

TEST(FakeCommunicatorTest, MatchesByPositionPerPair) {
  FakeCommunicatorHub hub(3, engine::CpuBackend::Get());
  auto r0 = hub.Create(0), r1 = hub.Create(1), r2 = hub.Create(2);
  engine::Tensor x = Filled(0), y = Filled(0), z = Filled(0);
  // Rank 1's first receive from 0 gets rank 0's first send to it, whatever
  // the groups look like; rank 2's traffic is separate.
  const uint64_t g0 =
      *r0->Launch({SendOp(1, Filled(100)), SendOp(2, Filled(300))});
  const uint64_t g1 = *r1->Launch({RecvOp(0, x)});
  const uint64_t g2 = *r2->Launch({RecvOp(0, z)});
  EXPECT_TRUE(Done(r0.get(), g0));
  EXPECT_TRUE(Done(r1.get(), g1));
  EXPECT_TRUE(Done(r2.get(), g2));
  const uint64_t g3 = *r0->Launch({SendOp(1, Filled(200))});
  const uint64_t g4 = *r1->Launch({RecvOp(0, y)});
  EXPECT_TRUE(Done(r0.get(), g3));
  EXPECT_TRUE(Done(r1.get(), g4));
  EXPECT_EQ(x.data<float>()[0], 100.0f);
  EXPECT_EQ(y.data<float>()[0], 200.0f);
  EXPECT_EQ(z.data<float>()[0], 300.0f);
}

TEST(FakeCommunicatorTest, InjectedErrorAndFreeze) {
  FakeCommunicatorHub hub(2, engine::CpuBackend::Get());
  auto a = hub.Create(0), b = hub.Create(1);
  hub.Freeze(1);
  const uint64_t ga = *a->Launch({SendOp(1, Filled(1))});
  const uint64_t gb = *b->Launch({RecvOp(0, Filled(0))});
  EXPECT_FALSE(Done(a.get(), ga));
  EXPECT_FALSE(Done(b.get(), gb));
  hub.InjectError(0, absl::UnavailableError("peer gone"));
  EXPECT_EQ(a->AsyncError(), absl::UnavailableError("peer gone"));
  EXPECT_EQ(a->Poll(ga).status(), absl::UnavailableError("peer gone"));
  a->Abort();
  EXPECT_TRUE(hub.aborted(0));
  EXPECT_TRUE(a->Quiescent());
}

}  // namespace
}  // namespace conveyor::transport
