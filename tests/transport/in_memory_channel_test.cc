#include "transport/in_memory_channel.h"

#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::transport {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

Tag T(int32_t mb, int32_t stage, TensorKind kind = TensorKind::kActivation) {
  return {.job = 1, .step = 0, .microbatch = mb, .stage = stage, .kind = kind};
}

TEST(InMemoryChannelTest, ReceivesByTagInAnyOrder) {
  InMemoryHub hub(2);
  auto a = engine::testing_util::FromVector({2}, {1, 2});
  auto b = engine::testing_util::FromVector({2}, {3, 4});
  ASSERT_TRUE(hub.endpoint(0)->Send(1, T(0, 0), a).ok());
  ASSERT_TRUE(hub.endpoint(0)->Send(1, T(1, 0), b).ok());
  auto second = hub.endpoint(1)->Recv(T(1, 0), 1s);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(engine::testing_util::ToVector(*second),
            (std::vector<float>{3, 4}));
  auto first = hub.endpoint(1)->Recv(T(0, 0), 1s);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(engine::testing_util::ToVector(*first), (std::vector<float>{1, 2}));
  // Same step and microbatch but a gradient: a different tag.
  EXPECT_EQ(hub.endpoint(1)
                ->Recv(T(0, 0, TensorKind::kGradient), 10ms)
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(InMemoryChannelTest, RecvWaitsForALaterSend) {
  InMemoryHub hub(2);
  std::thread sender([&] {
    std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(hub.endpoint(1)
                    ->Send(0, T(3, 1, TensorKind::kGradient),
                           engine::testing_util::FromVector({1}, {7}))
                    .ok());
  });
  auto got = hub.endpoint(0)->Recv(T(3, 1, TensorKind::kGradient), 2s);
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(engine::testing_util::ToVector(*got)[0], 7.0f);
}

TEST(InMemoryChannelTest, TimeoutNamesTheTensor) {
  InMemoryHub hub(2);
  auto got = hub.endpoint(1)->Recv(T(2, 0), 5ms);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(),
              HasSubstr("rank 1 waited 5 ms for the activation of stage 0, "
                        "step 0, microbatch 2"));
}

TEST(InMemoryChannelTest, AbortWakesWaitersAndFailsLaterCalls) {
  InMemoryHub hub(2);
  std::thread aborter([&] {
    std::this_thread::sleep_for(20ms);
    hub.AbortAll(absl::AbortedError("worker 1 lost"));
  });
  const auto start = std::chrono::steady_clock::now();
  auto got = hub.endpoint(0)->Recv(T(0, 1), 10s);
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(got.status().message(), HasSubstr("worker 1 lost"));
  EXPECT_EQ(hub.endpoint(1)
                ->Send(0, T(0, 1), engine::testing_util::FromVector({1}, {1}))
                .code(),
            absl::StatusCode::kAborted);
}

TEST(InMemoryChannelTest, RejectsUnknownRanksAndDuplicateTags) {
  InMemoryHub hub(2);
  auto t = engine::testing_util::FromVector({1}, {1});
  EXPECT_EQ(hub.endpoint(0)->Send(5, T(0, 0), t).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(hub.endpoint(0)->Send(1, T(0, 0), t).ok());
  EXPECT_EQ(hub.endpoint(0)->Send(1, T(0, 0), t).code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace conveyor::transport
