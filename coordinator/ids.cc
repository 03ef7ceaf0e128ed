#include "coordinator/ids.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace conveyor::coordinator {
namespace {

constexpr absl::string_view kJobPrefix = "job-";
constexpr absl::string_view kWorkerPrefix = "worker-";

template <typename N>
N NumberOf(absl::string_view id, absl::string_view prefix) {
  N n = 0;
  if (!absl::ConsumePrefix(&id, prefix) || !absl::SimpleAtoi(id, &n)) return 0;
  return n;
}

}  // namespace

std::string JobId(uint64_t number) { return absl::StrCat(kJobPrefix, number); }

std::string WorkerId(int64_t number) {
  return absl::StrCat(kWorkerPrefix, number);
}

uint64_t JobNumber(absl::string_view id) {
  return NumberOf<uint64_t>(id, kJobPrefix);
}

int64_t WorkerNumber(absl::string_view id) {
  return NumberOf<int64_t>(id, kWorkerPrefix);
}

}  // namespace conveyor::coordinator
