#include "coordinator/event_log.h"

#include <vector>

#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

v1::JobEvent Event(int64_t steps_done) {
  v1::JobEvent event;
  event.mutable_job()->set_steps_done(steps_done);
  return event;
}

std::vector<int64_t> Steps(const std::vector<v1::JobEvent>& events) {
  std::vector<int64_t> out;
  for (const v1::JobEvent& e : events) out.push_back(e.job().steps_done());
  return out;
}

TEST(EventLogTest, ReadsFromTheCursorAndAdvancesIt) {
  EventLog log(10);
  for (int i = 0; i < 4; ++i) log.Add(Event(i));
  int64_t cursor = 1;
  EXPECT_EQ(Steps(log.Read(&cursor)), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(cursor, 4);
  EXPECT_TRUE(log.Read(&cursor).empty());
  log.Add(Event(4));
  EXPECT_EQ(Steps(log.Read(&cursor)), (std::vector<int64_t>{4}));
}

TEST(EventLogTest, ANewWatcherStartsAtTheLatestEvent) {
  EventLog log(10);
  int64_t cursor = -1;
  EXPECT_EQ(log.Normalize(cursor), 0);  // Empty: waits for the first.
  EXPECT_TRUE(log.Read(&cursor).empty());
  EXPECT_EQ(cursor, 0);
  for (int i = 0; i < 3; ++i) log.Add(Event(i));
  cursor = -1;
  EXPECT_EQ(Steps(log.Read(&cursor)), (std::vector<int64_t>{2}));
}

TEST(EventLogTest, DropsTheOldestAndAWatcherBehindSkipsThem) {
  EventLog log(3);
  for (int i = 0; i < 7; ++i) log.Add(Event(i));
  EXPECT_EQ(log.first(), 4);
  EXPECT_EQ(log.end(), 7);
  int64_t cursor = 1;  // Behind: events 1-3 are gone.
  EXPECT_EQ(Steps(log.Read(&cursor)), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(cursor, 7);
}

TEST(EventLogTest, KeepNewestTrimsButKeepsNumbering) {
  EventLog log(100);
  for (int i = 0; i < 10; ++i) log.Add(Event(i));
  log.KeepNewest(2);
  EXPECT_EQ(log.first(), 8);
  EXPECT_EQ(log.end(), 10);
  log.KeepNewest(0);  // At least one is always kept.
  int64_t cursor = 0;
  EXPECT_EQ(Steps(log.Read(&cursor)), (std::vector<int64_t>{9}));
}

}  // namespace
}  // namespace conveyor::coordinator
