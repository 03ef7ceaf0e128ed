// Invariant checks: abort with file:line on a bug, never on bad input (that
// is what absl::Status is for).
//
//   CONVEYOR_CHECK(begin <= end, "stage bounds out of order");
//
// Backend-specific checks (CONVEYOR_CUDA_CHECK, later NCCL and cuBLAS) report
// through the same CheckFailed, so every invariant failure reads the same.
// Thread-safe.
#ifndef CONVEYOR_COMMON_CHECK_H_
#define CONVEYOR_COMMON_CHECK_H_

#include "absl/strings/string_view.h"

namespace conveyor::check_internal {

// Prints "<file>:<line>: check failed: <expression>: <message>" to stderr
// and aborts. Out of line, so each check inlines only a compare and a rarely
// taken branch.
[[noreturn]] void CheckFailed(const char* file, int line,
                              const char* expression,
                              absl::string_view message);

}  // namespace conveyor::check_internal

// Aborts unless `condition` holds; `message` says what it means.
#define CONVEYOR_CHECK(condition, message)                                    \
  do {                                                                        \
    if (!(condition)) [[unlikely]] {                                          \
      ::conveyor::check_internal::CheckFailed(__FILE__, __LINE__, #condition, \
                                              (message));                     \
    }                                                                         \
  } while (false)

#endif  // CONVEYOR_COMMON_CHECK_H_
