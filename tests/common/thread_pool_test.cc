#include "common/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

TEST(ThreadPoolTest, OneThreadRunsTasksInTheOrderPosted) {
  std::vector<int> order;
  {
    ThreadPool pool(1);
    for (int i = 0; i < 100; ++i) {
      pool.Post([&order, i] { order.push_back(i); });
    }
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(ThreadPoolTest, TasksRunAtOnceOnEveryThread) {
  // Each task waits until all four have started: a pool that ran fewer at
  // once would never let them finish.
  constexpr int kThreads = 4;
  Mutex mu;
  CondVar all_started;
  int started = 0;
  std::atomic<int> finished{0};
  {
    ThreadPool pool(kThreads);
    for (int i = 0; i < kThreads; ++i) {
      pool.Post([&] {
        MutexLock lock(mu);
        ++started;
        all_started.NotifyAll();
        if (all_started.WaitFor(mu, std::chrono::seconds(60),
                                [&] { return started == kThreads; })) {
          finished.fetch_add(1);
        }
      });
    }
  }
  EXPECT_EQ(finished.load(), kThreads);
}

TEST(ThreadPoolTest, DestructionRunsEveryTaskPostedIncludingTasksFromTasks) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 50; ++i) {
      pool.Post([&] {
        ran.fetch_add(1);
        pool.Post([&] { ran.fetch_add(1); });
      });
    }
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(ThreadPoolTest, QueuedCountsTasksNotYetStarted) {
  Mutex mu;
  bool release = false;
  ThreadPool pool(1);
  std::atomic<bool> blocking{false};
  pool.Post([&] {
    blocking.store(true);
    MutexLock lock(mu);
    CondVar never;
    // Polls: the test thread flips `release` without a notify.
    while (!release) {
      never.WaitFor(mu, std::chrono::milliseconds(1), [&] { return release; });
    }
  });
  while (!blocking.load()) std::this_thread::yield();
  pool.Post([] {});
  pool.Post([] {});
  EXPECT_EQ(pool.queued(), 2);
  {
    MutexLock lock(mu);
    release = true;
  }
}

}  // namespace
}  // namespace conveyor
