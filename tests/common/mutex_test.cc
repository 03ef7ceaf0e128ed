// Mutex, MutexLock, CondVar: the annotated wrappers still behave as
// std::mutex and std::condition_variable do. Nothing here asserts a timing:
// a wait that must time out uses a deadline already past or a short one
// whose predicate never becomes true.
#include "common/mutex.h"

#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

// True when another thread can take `mu` at this moment.
// (std::mutex::try_lock from the owning thread is undefined.)
bool FreeForAnotherThread(Mutex& mu) {
  bool got = false;
  std::thread([&] {
    if (mu.TryLock()) {
      got = true;
      mu.Unlock();
    }
  }).join();
  return got;
}

// Guarded state has to be a member for clang to check it.
struct Shared {
  Mutex mu;
  CondVar cv;
  int value ABSL_GUARDED_BY(mu) = 0;
};

TEST(MutexTest, TryLockFailsWhileAnotherThreadHoldsIt) {
  Mutex mu;
  {
    MutexLock lock(mu);
    EXPECT_FALSE(FreeForAnotherThread(mu));
  }
  EXPECT_TRUE(FreeForAnotherThread(mu));
  // And from the thread that had it.
  if (!mu.TryLock()) FAIL() << "TryLock of a free mutex failed";
  mu.Unlock();
}

TEST(MutexTest, MutexLockExcludesOtherThreads) {
  Shared shared;
  constexpr int kThreads = 4;
  constexpr int kIncrements = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        MutexLock lock(shared.mu);
        // A read and a separate write: without the lock, updates are lost.
        const int seen = shared.value;
        shared.value = seen + 1;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  MutexLock lock(shared.mu);
  EXPECT_EQ(shared.value, kThreads * kIncrements);
}

TEST(MutexTest, IsLockableForStdLocks) {
  Mutex mu;
  {
    std::unique_lock<Mutex> lock(mu);
    EXPECT_TRUE(lock.owns_lock());
    EXPECT_FALSE(FreeForAnotherThread(mu));
  }
  EXPECT_TRUE(FreeForAnotherThread(mu));
  std::unique_lock<Mutex> lock(mu, std::try_to_lock);
  EXPECT_TRUE(lock.owns_lock());
}

TEST(CondVarTest, WaitReturnsOnceThePredicateHolds) {
  Shared shared;
  std::thread producer([&] {
    for (int i = 1; i <= 3; ++i) {
      MutexLock lock(shared.mu);
      shared.value = i;
      shared.cv.NotifyAll();
    }
  });
  {
    MutexLock lock(shared.mu);
    shared.cv.Wait(shared.mu, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared.mu) {
      return shared.value == 3;
    });
    EXPECT_EQ(shared.value, 3);
  }
  producer.join();
}

TEST(CondVarTest, TheMutexIsFreeWhileWaitingAndHeldAfter) {
  Shared shared;
  std::promise<void> waiting;
  std::thread waiter([&] {
    MutexLock lock(shared.mu);
    waiting.set_value();
    shared.cv.Wait(shared.mu, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared.mu) {
      return shared.value == 1;
    });
    EXPECT_FALSE(FreeForAnotherThread(shared.mu));
  });
  waiting.get_future().wait();
  {
    // Blocks forever unless the waiter released the mutex to wait.
    MutexLock lock(shared.mu);
    shared.value = 1;
    shared.cv.NotifyOne();
  }
  waiter.join();
  EXPECT_TRUE(FreeForAnotherThread(shared.mu));
}

TEST(CondVarTest, WaitUntilAPastDeadlineReturnsThePredicate) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(mu);
  const auto past = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  EXPECT_FALSE(cv.WaitUntil(mu, past, [] { return false; }));
  EXPECT_TRUE(cv.WaitUntil(mu, past, [] { return true; }));
}

TEST(CondVarTest, WaitUntilAndWaitForTimeOutWithoutANotify) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(mu);
  EXPECT_FALSE(cv.WaitUntil(
      mu, std::chrono::steady_clock::now() + std::chrono::milliseconds(20),
      [] { return false; }));
  EXPECT_FALSE(
      cv.WaitFor(mu, std::chrono::milliseconds(20), [] { return false; }));
}

TEST(CondVarTest, WaitUntilReturnsTrueWhenNotifiedBeforeTheDeadline) {
  Shared shared;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared.mu) {
    return shared.value == 1;
  };
  std::thread setter([&] {
    MutexLock lock(shared.mu);
    shared.value = 1;
    shared.cv.NotifyAll();
  });
  {
    MutexLock lock(shared.mu);
    // An hour: the notify, not the deadline, ends the wait.
    EXPECT_TRUE(shared.cv.WaitUntil(
        shared.mu, std::chrono::steady_clock::now() + std::chrono::hours(1),
        ready));
    EXPECT_TRUE(shared.cv.WaitFor(shared.mu, std::chrono::hours(1), ready));
  }
  setter.join();
}

}  // namespace
}  // namespace conveyor
