// Error propagation macros for absl::Status / absl::StatusOr.
//
// Conveyor's convention: anything that can fail for outside reasons (input,
// I/O, peers, devices) returns absl::Status or absl::StatusOr<T>; exceptions
// never cross a module boundary; broken invariants abort (CHECK-style).
// Debian's abseil (20220623) predates absl/status/status_macros.h, so the two
// macros every caller needs are defined here once.
//
//   RETURN_IF_ERROR(WriteHeader(file));
//   ASSIGN_OR_RETURN(Schedule schedule, GenerateSchedule(kind, options));
//
// Thread-safety: stateless macros.
#ifndef CONVEYOR_COMMON_STATUS_MACROS_H_
#define CONVEYOR_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CONVEYOR_STATUS_CONCAT_INNER_(a, b) a##b
#define CONVEYOR_STATUS_CONCAT_(a, b) CONVEYOR_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) once; returns it from the enclosing
// function when it is not OK.
#define RETURN_IF_ERROR(expr)                                               \
  do {                                                                      \
    if (::absl::Status conveyor_status_ = (expr); !conveyor_status_.ok()) { \
      return conveyor_status_;                                              \
    }                                                                       \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>) once; on error returns its status,
// otherwise moves the value into `lhs`, which may declare a new variable.
// It expands to several statements: inside an `if`, use braces.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  CONVEYOR_ASSIGN_OR_RETURN_IMPL_(   \
      CONVEYOR_STATUS_CONCAT_(conveyor_statusor_, __LINE__), lhs, rexpr)

#define CONVEYOR_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  if (!statusor.ok()) {                                       \
    return std::move(statusor).status();                      \
  }                                                           \
  lhs = std::move(statusor).value()

#endif  // CONVEYOR_COMMON_STATUS_MACROS_H_
