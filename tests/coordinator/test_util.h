// Fakes shared by the coordinator's tests: a worker connection that records
// what the coordinator sends, and a small job file (tests/job/test_jobs.h).
#ifndef CONVEYOR_TESTS_COORDINATOR_TEST_UTIL_H_
#define CONVEYOR_TESTS_COORDINATOR_TEST_UTIL_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/worker_registry.h"
#include "tests/job/test_jobs.h"

namespace conveyor::coordinator {

// A worker session that records what the coordinator sends.
class FakeConnection final : public WorkerConnection {
 public:
  bool Send(const v1::CoordinatorMessage& message) override {
    if (closed) return false;
    sent.push_back(message);
    return true;
  }
  void Close(const absl::Status& status) override {
    closed = true;
    close_status = status;
  }
  // Messages of one kind, in order.
  std::vector<v1::CoordinatorMessage> Of(
      v1::CoordinatorMessage::KindCase kind) const {
    std::vector<v1::CoordinatorMessage> out;
    for (const auto& m : sent) {
      if (m.kind_case() == kind) out.push_back(m);
    }
    return out;
  }

  std::vector<v1::CoordinatorMessage> sent;
  bool closed = false;
  absl::Status close_status;
};

inline constexpr char kVersion[] = "9.9.9";

using ::conveyor::job::testing::JobYaml;

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_TESTS_COORDINATOR_TEST_UTIL_H_
