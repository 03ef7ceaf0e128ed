#include "coordinator/scheduling_policy.h"

#include <algorithm>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/printable.h"
#include "job/job_policy.h"

namespace conveyor::coordinator {

namespace {

// No fleet is larger; a bigger number is a typo.
constexpr int kMaxQuota = 1 << 20;

}  // namespace

absl::StatusOr<OwnerQuotas> ParseOwnerQuotas(absl::string_view text) {
  OwnerQuotas quotas;
  if (text.empty()) return quotas;
  constexpr absl::string_view kExpected =
      "expected OWNER=WORKERS[,OWNER=WORKERS...], e.g. team-a=16,team-b=8";
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    const std::string shown = Printable(std::string(entry.substr(0, 80)));
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--owner-quota: '", shown, "' has no '='; ", kExpected));
    }
    const std::string owner(entry.substr(0, eq));
    const absl::string_view count = entry.substr(eq + 1);
    if (!job::IsValidOwner(owner)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--owner-quota: '", shown, "': the owner must be 1 to ",
          job::kMaxOwnerBytes, " characters of ", job::kOwnerCharacters,
          " (as a job's owner:); ", kExpected));
    }
    int workers = 0;
    if (count.empty() ||
        count.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(count, &workers) || workers < 1 ||
        workers > kMaxQuota) {
      return absl::InvalidArgumentError(
          absl::StrCat("--owner-quota: '", shown,
                       "': the quota must be a whole number of workers in [1, ",
                       kMaxQuota, "]; ", kExpected));
    }
    if (!quotas.emplace(owner, workers).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--owner-quota: owner '", owner, "' is given twice; ", kExpected));
    }
  }
  return quotas;
}

std::optional<std::vector<uint64_t>> ChooseVictims(
    std::vector<PreemptionCandidate> candidates, int needed) {
  if (needed <= 0) return std::vector<uint64_t>{};
  std::sort(candidates.begin(), candidates.end(),
            [](const PreemptionCandidate& a, const PreemptionCandidate& b) {
              return std::make_tuple(a.priority, -a.workers,
                                     -static_cast<int64_t>(a.number)) <
                     std::make_tuple(b.priority, -b.workers,
                                     -static_cast<int64_t>(b.number));
            });
  std::vector<PreemptionCandidate> chosen;
  int freed = 0;
  for (const PreemptionCandidate& c : candidates) {
    if (freed >= needed) break;
    if (c.workers <= 0) continue;
    chosen.push_back(c);
    freed += c.workers;
  }
  if (freed < needed) return std::nullopt;
  // Spare what the rest cover, from the last chosen (highest priority,
  // smallest) back.
  for (int i = static_cast<int>(chosen.size()) - 1; i >= 0; --i) {
    if (freed - chosen[i].workers >= needed) {
      freed -= chosen[i].workers;
      chosen.erase(chosen.begin() + i);
    }
  }
  std::vector<uint64_t> out;
  for (const PreemptionCandidate& c : chosen) out.push_back(c.number);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace conveyor::coordinator
