#include "coordinator/stream_limiter.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(StreamLimiterTest, ClientIsThePeersHostWithoutThePort) {
  EXPECT_EQ(StreamLimiter::ClientOf("ipv4:10.0.0.5:40312"), "10.0.0.5");
  EXPECT_EQ(StreamLimiter::ClientOf("ipv6:[::1]:5"), "[::1]");
  EXPECT_EQ(StreamLimiter::ClientOf("unix:/tmp/s"), "unix:/tmp/s");
  EXPECT_EQ(StreamLimiter::ClientOf(""), "");
}

TEST(StreamLimiterTest, CapsEachClientAndEveryoneAndGivesPlacesBack) {
  StreamLimiter limiter(/*max_total=*/3, /*max_per_client=*/2);
  std::vector<StreamLimiter::Slot> held;
  for (int port : {1, 2}) {
    std::optional<StreamLimiter::Slot> s =
        limiter.Acquire(absl::StrCat("ipv4:10.0.0.1:", port));
    ASSERT_TRUE(s.has_value());
    held.push_back(*std::move(s));
  }
  // The same host on another port shares its cap.
  EXPECT_FALSE(limiter.Acquire("ipv4:10.0.0.1:3").has_value());
  EXPECT_THAT(limiter.Refusal("ipv4:10.0.0.1:3"),
              HasSubstr("2 from 10.0.0.1 (at most 2 per client) and 2 in all "
                        "(at most 3)"));
  std::optional<StreamLimiter::Slot> other = limiter.Acquire("ipv4:10.0.0.2:1");
  ASSERT_TRUE(other.has_value());
  // Everyone's cap: a third host is refused too.
  EXPECT_FALSE(limiter.Acquire("ipv4:10.0.0.3:1").has_value());
  EXPECT_EQ(limiter.open(), 3);
  other.reset();
  EXPECT_EQ(limiter.open(), 2);
  EXPECT_TRUE(limiter.Acquire("ipv4:10.0.0.3:1").has_value());  // Released.
  held.clear();
  EXPECT_EQ(limiter.open(), 0);
  // A refused client leaves no entry behind to count against it.
  EXPECT_THAT(limiter.Refusal("ipv4:10.0.0.9:1"), HasSubstr("0 from 10.0.0.9"));
}

}  // namespace
}  // namespace conveyor::coordinator
