// A fresh, empty directory for the running test, under gtest's TempDir and
// named after the test and the process (tests run in parallel under ctest).
#ifndef CONVEYOR_TESTS_TESTING_TEST_DIR_H_
#define CONVEYOR_TESTS_TESTING_TEST_DIR_H_

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace conveyor::testing_util {

// <TempDir>/<prefix>_<pid>_<test name>, emptied and created.
inline std::filesystem::path FreshTestDir(absl::string_view prefix) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat(
          prefix, "_", getpid(), "_",
          ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace conveyor::testing_util

#endif  // CONVEYOR_TESTS_TESTING_TEST_DIR_H_
