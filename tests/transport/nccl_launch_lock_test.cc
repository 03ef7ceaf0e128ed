#include "transport/nccl/nccl_launch_lock.h"

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor::transport {
namespace {

using namespace std::chrono_literals;

// A second holder of a device waits until the first lets go.
TEST(NcclLaunchLockTest, OneDeviceHasOneHolderAtATime) {
  std::atomic<bool> second_holds{false};
  std::thread second;
  {
    NcclLaunchLock first({3});
    second = std::thread([&] {
      NcclLaunchLock lock({3});
      second_holds = true;
    });
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(second_holds.load());
  }
  second.join();
  EXPECT_TRUE(second_holds.load());
}

// Ranks of one process on different GPUs must not wait for each other:
// one holding device 0 while it waits for its peer on device 1 to connect.
TEST(NcclLaunchLockTest, OtherDevicesAreNotBlocked) {
  NcclLaunchLock first({0});
  std::atomic<bool> other_held{false};
  std::thread other([&] {
    NcclLaunchLock lock({1});
    other_held = true;
  });
  other.join();  // Would hang if device 1 waited for device 0's holder.
  EXPECT_TRUE(other_held.load());
}

// A mesh locks all its devices, a channel one of them: in whatever order
// they are named, holders never deadlock, and no two hold a device at once.
TEST(NcclLaunchLockTest, SeveralDevicesInAnyOrderNeverDeadlock) {
  std::vector<std::atomic<int>> holders(3);
  std::atomic<int> overlaps{0};
  auto hammer = [&](std::vector<int> devices) {
    std::set<int> distinct(devices.begin(), devices.end());
    for (int i = 0; i < 2000; ++i) {
      NcclLaunchLock lock(devices);
      for (int d : distinct) {
        if (holders[d].fetch_add(1) != 0) ++overlaps;
      }
      for (int d : distinct) holders[d].fetch_sub(1);
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(hammer, std::vector<int>{0, 1, 2});
  threads.emplace_back(hammer, std::vector<int>{2, 1, 0});
  threads.emplace_back(hammer, std::vector<int>{1, 1});  // Duplicates: once.
  threads.emplace_back(hammer, std::vector<int>{2});
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
}

}  // namespace
}  // namespace conveyor::transport
