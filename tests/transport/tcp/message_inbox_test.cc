#include "transport/tcp/internal/message_inbox.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::transport::tcp_internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

constexpr std::chrono::milliseconds kNoWait{0};

// Records what the inbox hands it.
class RecordingHandler : public TcpChannel::MessageHandler {
 public:
  void OnMessage(int from, std::string message) override {
    messages.emplace_back(from, std::move(message));
  }
  void OnChannelFailed(const absl::Status& status) override {
    failures.push_back(status);
  }
  std::vector<std::pair<int, std::string>> messages;
  std::vector<absl::Status> failures;
};

// The channel posts Flush to its I/O thread; these tests run it by hand.
struct InboxTest : ::testing::Test {
  int flushes_scheduled = 0;
  MessageInbox inbox{/*rank=*/3, [this] { ++flushes_scheduled; }};
};

TEST_F(InboxTest, TakeReturnsTheFirstMessageOfTheAskedRank) {
  inbox.Add(1, "a");
  inbox.Add(2, "b");
  inbox.Add(1, "c");
  EXPECT_EQ(inbox.Take(1, kNoWait).value(), "a");
  EXPECT_EQ(inbox.Take(2, kNoWait).value(), "b");
  EXPECT_EQ(inbox.Take(1, kNoWait).value(), "c");
}

TEST_F(InboxTest, TakeTimesOutWithDeadlineExceeded) {
  inbox.Add(2, "not for rank 1");
  const absl::StatusOr<std::string> taken =
      inbox.Take(1, std::chrono::milliseconds(5));
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(taken.status().message(),
              HasSubstr("rank 3 waited 5 ms for a message from rank 1"));
}

TEST_F(InboxTest, TakeHandsOutWhatArrivedBeforeTheFailureThenTheFailure) {
  inbox.Add(1, "early");
  inbox.Fail(absl::UnavailableError("peer lost"));
  inbox.Add(1, "late");  // Dropped: nothing comes after the failure.
  EXPECT_EQ(inbox.Take(1, kNoWait).value(), "early");
  EXPECT_EQ(inbox.Take(1, kNoWait).status(),
            absl::UnavailableError("peer lost"));
}

TEST_F(InboxTest, TakeWhileAHandlerIsSetIsFailedPrecondition) {
  RecordingHandler handler;
  inbox.SetHandler(&handler);
  EXPECT_EQ(inbox.Take(1, kNoWait).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(InboxTest, SettingAHandlerSchedulesAFlushOfWhatArrivedBefore) {
  inbox.Add(1, "a");
  inbox.Add(2, "b");
  RecordingHandler handler;
  inbox.SetHandler(&handler);
  EXPECT_EQ(flushes_scheduled, 1);
  EXPECT_TRUE(handler.messages.empty());  // Only on the flushing thread.
  inbox.Flush();
  EXPECT_THAT(handler.messages, ElementsAre(Pair(1, "a"), Pair(2, "b")));
}

TEST_F(InboxTest, HandlerHearsTheFailureOnceAfterEveryEarlierMessage) {
  RecordingHandler handler;
  inbox.SetHandler(&handler);
  inbox.Add(1, "a");
  inbox.Fail(absl::AbortedError("stop"));
  inbox.Flush();
  inbox.Flush();
  EXPECT_THAT(handler.messages, ElementsAre(Pair(1, "a")));
  ASSERT_EQ(handler.failures.size(), 1u);
  EXPECT_EQ(handler.failures[0], absl::AbortedError("stop"));
}

TEST_F(InboxTest, NoDeliveryAfterTheHandlerIsCleared) {
  RecordingHandler handler;
  inbox.SetHandler(&handler);
  inbox.SetHandler(nullptr);
  EXPECT_EQ(flushes_scheduled, 1);  // Clearing schedules nothing.
  inbox.Add(1, "kept");
  inbox.Flush();
  EXPECT_TRUE(handler.messages.empty());
  // Without a handler the message waits for Take.
  EXPECT_EQ(inbox.Take(1, kNoWait).value(), "kept");
}

}  // namespace
}  // namespace conveyor::transport::tcp_internal
