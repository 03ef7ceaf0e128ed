#include "transport/nccl/internal/round.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace conveyor::transport::p2p_internal {

std::string Describe(const InFlight& f) {
  std::vector<std::string> parts;
  const size_t total = f.sends.size() + f.receives.size();
  for (const OutgoingSend& s : f.sends) {
    if (parts.size() == kDescribedOps) break;
    parts.push_back(
        absl::StrCat("send the ", ToString(s.header.tag), " to rank ", s.to));
  }
  for (const Received& r : f.receives) {
    if (parts.size() == kDescribedOps) break;
    parts.push_back(
        absl::StrCat("receive the ", ToString(r.tag), " from rank ", r.from));
  }
  std::string out = absl::StrJoin(parts, ", ");
  if (total > parts.size()) {
    absl::StrAppend(&out, " and ", total - parts.size(), " more");
  }
  if (total == 0) out = "nothing";
  return out;
}

}  // namespace conveyor::transport::p2p_internal
