#include "coordinator/worker_registry.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/protocol.h"

namespace conveyor::coordinator {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;
using TimePoint = WorkerRegistry::TimePoint;

v1::RegisterRequest Request(const std::string& name, int devices = 1) {
  v1::RegisterRequest r;
  r.set_name(name);
  r.set_version("1.0");
  r.set_protocol_version(proto::kProtocolVersion);
  for (int d = 0; d < devices; ++d) r.add_devices("cpu");
  return r;
}

TEST(WorkerRegistryTest, ChecksVersionsAndNames) {
  const WorkerRegistry registry("1.0");
  EXPECT_TRUE(registry.CheckRequest(Request("a")).ok());
  v1::RegisterRequest old = Request("a");
  old.set_version("0.9");
  EXPECT_EQ(registry.CheckRequest(old).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(registry.CheckRequest(old).message(),
              HasSubstr("runs Conveyor 0.9"));
  v1::RegisterRequest protocol = Request("a");
  protocol.set_protocol_version(proto::kProtocolVersion + 1);
  EXPECT_EQ(registry.CheckRequest(protocol).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.CheckRequest(Request("")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.CheckRequest(Request("a", 0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.CheckRequest(Request("a\x1b[2J")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.CheckRequest(Request(std::string(254, 'n'))).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.CheckRequest(Request(std::string(253, 'n'))).ok());
  // Any release, when the coordinator names none.
  EXPECT_TRUE(WorkerRegistry("").CheckRequest(old).ok());
}

TEST(WorkerRegistryTest, NumbersWorkersAndKeepsLiveNamesUnique) {
  WorkerRegistry registry("1.0");
  const TimePoint now{};
  auto a = registry.Add(Request("a"), nullptr, now, 1000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->info.id(), "worker-1");
  EXPECT_EQ((*a)->info.state(), v1::IDLE);
  EXPECT_EQ((*a)->info.registered_unix_ms(), 1000);
  EXPECT_EQ(registry.Add(Request("a"), nullptr, now, 0).status().code(),
            absl::StatusCode::kAlreadyExists);
  // A lost worker's name is free again; a refused registration takes no id.
  (*a)->info.set_state(v1::LOST);
  auto again = registry.Add(Request("a"), nullptr, now, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->info.id(), "worker-2");
  // The lost record of the name is gone with the worker's return.
  EXPECT_EQ(registry.Find("worker-1"), nullptr);
  EXPECT_EQ(registry.Find("worker-2"), *again);
  EXPECT_EQ(registry.Find("worker-3"), nullptr);
  EXPECT_EQ(registry.Find("job-1"), nullptr);
  EXPECT_EQ(registry.Find("worker-x"), nullptr);
  registry.Erase("worker-2");
  EXPECT_EQ(registry.Find("worker-2"), nullptr);
  EXPECT_TRUE(registry.All().empty());
}

// A worker back under its name replaces its lost record (which would keep
// the worker-lost alert firing), and lost records are capped, oldest first.
TEST(WorkerRegistryTest, ForgetsLostRecordsOfReturningNamesAndTheOldest) {
  WorkerRegistry registry("1.0");
  const TimePoint now{};
  auto lose = [&](const std::string& name) {
    absl::StatusOr<WorkerRecord*> w =
        registry.Add(Request(name), nullptr, now, 0);
    EXPECT_TRUE(w.ok()) << w.status();
    (*w)->info.set_state(v1::LOST);
    return (*w)->info.id();
  };
  const std::string first = lose("a");
  ASSERT_TRUE(registry.Add(Request("a"), nullptr, now, 0).ok());
  EXPECT_EQ(registry.Find(first), nullptr);
  EXPECT_EQ(registry.All().size(), 1u);

  std::vector<std::string> ids;
  for (size_t i = 0; i < WorkerRegistry::kMaxLostWorkers + 5; ++i) {
    ids.push_back(lose(absl::StrCat("pod-", i)));
  }
  ASSERT_TRUE(registry.Add(Request("new"), nullptr, now, 0).ok());
  // a, new, and the newest kMaxLostWorkers - 1 lost ones.
  EXPECT_EQ(registry.All().size(), WorkerRegistry::kMaxLostWorkers + 1);
  EXPECT_EQ(registry.Find(ids.front()), nullptr);
  EXPECT_NE(registry.Find(ids.back()), nullptr);
}

TEST(WorkerRegistryTest, CountsLiveAndIdleWorkersByDevices) {
  WorkerRegistry registry("");
  const TimePoint now{};
  WorkerRecord* one = *registry.Add(Request("one", 1), nullptr, now, 0);
  WorkerRecord* two = *registry.Add(Request("two", 2), nullptr, now, 0);
  WorkerRecord* lost = *registry.Add(Request("lost", 2), nullptr, now, 0);
  lost->info.set_state(v1::LOST);
  EXPECT_EQ(registry.Live(), 2);
  EXPECT_EQ(registry.Live(2), 1);
  EXPECT_EQ(registry.Idle(1), (std::vector<WorkerRecord*>{one, two}));
  two->info.set_state(v1::BUSY);
  EXPECT_EQ(registry.Idle(1), (std::vector<WorkerRecord*>{one}));
  EXPECT_TRUE(registry.Idle(2).empty());
}

TEST(WorkerRegistryTest, FindsSilentWorkersAndDiscountsAStall) {
  WorkerRegistry registry("");
  const TimePoint start{};
  WorkerRecord* early = *registry.Add(Request("early"), nullptr, start, 0);
  WorkerRecord* late =
      *registry.Add(Request("late"), nullptr, start + seconds(8), 0);
  const TimePoint now = start + seconds(12);
  EXPECT_EQ(registry.Silent(now, seconds(10)),
            (std::vector<WorkerRecord*>{early}));
  // A 5 s stall of the coordinator is no worker's silence, but a worker is
  // never seen later than now.
  registry.DiscountStall(seconds(5), now);
  EXPECT_EQ(early->last_seen, start + seconds(5));
  EXPECT_EQ(late->last_seen, now);
  EXPECT_TRUE(registry.Silent(now, seconds(10)).empty());
  early->info.set_state(v1::LOST);
  EXPECT_TRUE(registry.Silent(now + seconds(60), seconds(10)).size() == 1u);
}

}  // namespace
}  // namespace conveyor::coordinator
