#include "transport/mailbox.h"

#include <chrono>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::transport {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

Tag T(int mb) {
  return {.job = 5,
          .step = 2,
          .microbatch = mb,
          .stage = 1,
          .kind = TensorKind::kActivation};
}

engine::Tensor Scalar(float v) {
  return engine::testing_util::FromVector({1}, {v});
}

float ValueOf(const engine::Tensor& t) {
  return engine::testing_util::ToVector(t)[0];
}

// A channel's view of a mailbox: the mutex and the failure status that
// guard it.
struct Owner {
  absl::Mutex mu;
  absl::Status failure ABSL_GUARDED_BY(mu);
  Mailbox box ABSL_GUARDED_BY(mu){3};

  absl::StatusOr<std::optional<engine::Tensor>> Await(
      const Tag& tag, std::chrono::milliseconds timeout) {
    absl::MutexLock lock(&mu);
    return box.Await(mu, failure, tag, timeout);
  }
};

TEST(MailboxTest, TakesTensorsByTagInAnyOrderAndOnlyOnce) {
  Owner o;
  {
    absl::MutexLock lock(&o.mu);
    ASSERT_TRUE(o.box.File(T(0), Scalar(10), 2).ok());
    ASSERT_TRUE(o.box.File(T(1), Scalar(11), 2).ok());
    EXPECT_EQ(o.box.size(), 2u);
  }
  absl::StatusOr<std::optional<engine::Tensor>> one = o.Await(T(1), 0ms);
  ASSERT_TRUE(one.ok() && one->has_value());
  EXPECT_EQ(ValueOf(**one), 11);
  absl::StatusOr<std::optional<engine::Tensor>> zero = o.Await(T(0), 0ms);
  ASSERT_TRUE(zero.ok() && zero->has_value());
  EXPECT_EQ(ValueOf(**zero), 10);
  // Taken: a second Recv of the same tag waits and times out.
  absl::StatusOr<std::optional<engine::Tensor>> again = o.Await(T(0), 5ms);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
}

TEST(MailboxTest, ASecondCopyOfATagIsAnInternalErrorNamingBothRanks) {
  Owner o;
  absl::MutexLock lock(&o.mu);
  ASSERT_TRUE(o.box.File(T(0), Scalar(1), 2).ok());
  const absl::Status dup = o.box.File(T(0), Scalar(2), 4);
  EXPECT_EQ(dup.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(dup.message(), HasSubstr("rank 3 received the activation"));
  EXPECT_THAT(dup.message(), HasSubstr("twice (again from rank 4)"));
}

TEST(MailboxTest, AWaitingRecvWakesForItsTagFiledFromAnotherThread) {
  Owner o;
  std::thread filer([&] {
    std::this_thread::sleep_for(20ms);
    absl::MutexLock lock(&o.mu);
    ASSERT_TRUE(o.box.File(T(1), Scalar(3), 0).ok());  // Not the one awaited.
    ASSERT_TRUE(o.box.File(T(7), Scalar(7), 0).ok());
  });
  absl::StatusOr<std::optional<engine::Tensor>> t = o.Await(T(7), 10s);
  filer.join();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_value());
  EXPECT_EQ(ValueOf(**t), 7);
}

TEST(MailboxTest, AFailureWakesAWaitingRecvWithItsCodeAndContext) {
  Owner o;
  std::thread failer([&] {
    std::this_thread::sleep_for(20ms);
    absl::MutexLock lock(&o.mu);
    o.failure = absl::UnavailableError("worker 2 lost");
  });
  absl::StatusOr<std::optional<engine::Tensor>> t = o.Await(T(0), 10s);
  failer.join();
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(t.status().message(),
              HasSubstr("rank 3 waiting for the activation of stage 1, step "
                        "2, microbatch 0 (job 5): worker 2 lost"));
}

TEST(MailboxTest, AFailureWinsOverATensorThatArrived) {
  Owner o;
  absl::MutexLock lock(&o.mu);
  ASSERT_TRUE(o.box.File(T(0), Scalar(1), 2).ok());
  o.failure = absl::AbortedError("cancelled");
  EXPECT_EQ(o.box.Await(o.mu, o.failure, T(0), 0ms).status().code(),
            absl::StatusCode::kAborted);
  o.box.Clear();
  EXPECT_EQ(o.box.size(), 0u);
}

TEST(MailboxTest, TimeoutErrorsNameTheTagAndWhatTheChannelKnows) {
  Mailbox box(6);
  const absl::Status plain = box.TimeoutError(T(2), 250ms);
  EXPECT_EQ(plain.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(plain.message(),
            "rank 6 waited 250 ms for the activation of stage 1, step 2, "
            "microbatch 2 (job 5)");
  EXPECT_THAT(
      box.TimeoutError(T(2), 250ms, "no peer has announced it").message(),
      HasSubstr("(job 5) (no peer has announced it)"));
}

}  // namespace
}  // namespace conveyor::transport
