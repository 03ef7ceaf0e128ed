// What a plan says to its users (job/planner.h DescribePlan and
// ScheduleChoice): the stages, their layers and costs, and for an automatic
// choice the candidates the planner weighed and why it kept one.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "job/internal/plan_text.h"
#include "job/planner.h"

namespace conveyor::job {

using job_internal::Bytes;
using job_internal::Reason;

namespace {

// schedule: auto's candidates, one line each, and why the winner won.
std::string DescribeCandidates(const JobPlan& plan) {
  const AutoSplitPlan& a = *plan.auto_split;
  std::string out = absl::StrFormat(
      "schedule: auto considered %d candidate(s) for %d worker(s):\n"
      "%-18s %-3s %12s %8s %14s\n",
      a.candidates.size(), plan.job.pipeline.workers, "schedule", "V",
      "step ms", "bubble", "peak memory");
  for (const ScheduleCandidate& c : a.candidates) {
    const bool chosen = c.schedule == plan.job.pipeline.schedule &&
                        c.virtual_stages == plan.virtual_stages;
    if (!c.search.has_value()) {
      absl::StrAppendFormat(&out, "%-18s %-3d %s\n", c.schedule,
                            c.virtual_stages,
                            absl::StrCat("not possible: ", Reason(c.refused)));
      continue;
    }
    double peak = 0;
    for (double m : c.search->rank_memory) peak = std::max(peak, m);
    absl::StrAppendFormat(&out, "%-18s %-3d %12.3f %7.1f%% %14s%s\n",
                          c.schedule, c.virtual_stages,
                          c.search->makespan * 1e3,
                          c.search->bubble_fraction * 100, Bytes(peak),
                          chosen ? "  <- chosen" : "");
  }
  absl::StrAppend(&out, "chosen: ", ScheduleChoice(plan), "\n");
  return out;
}

std::string DescribeAutoSplit(const JobPlan& plan) {
  const AutoSplitPlan& a = *plan.auto_split;
  const scheduler::StageSearchResult& r = a.search;
  std::string out =
      a.candidates.empty() ? std::string() : DescribeCandidates(plan);
  absl::StrAppendFormat(
      &out,
      "stages: auto from a profile on %s%s (microbatch of %d samples); "
      "%s search, %d split(s) simulated\n",
      a.profiled_on, a.from_cache ? " (cached)" : "",
      plan.job.training.microbatch_size(),
      r.exhaustive ? "exhaustive" : "local", r.simulations);
  absl::StrAppendFormat(&out, "%-6s %-6s %-12s %9s %9s %9s %14s\n", "stage",
                        "rank", "layers", "F ms", "BI ms", "BW ms", "memory");
  for (const StagePlan& s : plan.stages) {
    double f = 0, bi = 0, bw = 0;
    // The profile may have been dropped once cached (JobManager).
    for (int i = s.first_layer; i < s.first_layer + s.num_layers &&
                                i < static_cast<int>(a.profile.size());
         ++i) {
      f += a.profile[i].forward_seconds;
      bi += a.profile[i].backward_input_seconds;
      bw += a.profile[i].backward_weight_seconds;
    }
    absl::StrAppendFormat(
        &out, "%-6d %-6d %-12s %9.3f %9.3f %9.3f %14s\n", s.stage, s.rank,
        absl::StrCat(s.first_layer, "-", s.first_layer + s.num_layers - 1),
        f * 1e3, bi * 1e3, bw * 1e3,
        s.stage < static_cast<int>(r.stage_memory.size())
            ? Bytes(r.stage_memory[s.stage])
            : "?");
  }
  double peak = 0;
  for (double m : r.rank_memory) peak = std::max(peak, m);
  absl::StrAppendFormat(
      &out, "predicted step %.3f ms, bubble %.1f%%, peak memory per device %s",
      r.makespan * 1e3, r.bubble_fraction * 100, Bytes(peak));
  if (plan.job.pipeline.memory_budget_bytes > 0) {
    absl::StrAppendFormat(&out, " (budget %s)",
                          Bytes(plan.job.pipeline.memory_budget_bytes));
  }
  out += "\n";
  std::vector<int> even_layers;
  for (size_t i = 0; i < r.even_stage_begin.size(); ++i) {
    const int end = i + 1 < r.even_stage_begin.size()
                        ? r.even_stage_begin[i + 1]
                        : static_cast<int>(plan.job.model.layers.size());
    even_layers.push_back(end - r.even_stage_begin[i]);
  }
  if (r.even_makespan.has_value() && r.makespan > 0) {
    absl::StrAppendFormat(
        &out,
        "even split (%s layers): predicted step %.3f ms; the chosen split is "
        "predicted %.2fx as fast\n",
        absl::StrJoin(even_layers, ","), *r.even_makespan * 1e3,
        *r.even_makespan / r.makespan);
  } else {
    absl::StrAppendFormat(&out,
                          "even split (%s layers): not comparable (it breaks "
                          "a boundary marker or the memory budget)\n",
                          absl::StrJoin(even_layers, ","));
  }
  return out;
}

}  // namespace

std::string DescribePlan(const JobPlan& plan) {
  const JobSpec& job = plan.job;
  std::string out = absl::StrFormat(
      "job %s: %s, %d worker(s) x %d virtual stage(s) = %d stage(s); %d "
      "steps of batch %d in %d microbatches of %d\n",
      job.name, scheduler::ScheduleKindName(plan.schedule.kind), plan.num_ranks,
      plan.virtual_stages, plan.num_stages, job.training.steps,
      job.training.batch_size, job.training.microbatches,
      job.training.microbatch_size());
  if (const int64_t d = job.pipeline.devices_per_stage; d > 1) {
    const int64_t t = job.pipeline.tensor_parallel;
    absl::StrAppendFormat(
        &out,
        "each stage on a mesh of %d device(s): %d replica(s) (data parallel, "
        "each microbatch's rows split over them) x %d tensor-parallel "
        "rank(s); %d stage(s) x %d x %d = %d devices\n",
        d, d / t, t, plan.num_stages, d / t, t, plan.num_stages * d);
  }
  absl::StrAppendFormat(&out, "%-6s %-6s %-12s %-40s %12s\n", "stage", "rank",
                        "layers", "kinds", "parameters");
  for (const StagePlan& s : plan.stages) {
    std::string kinds;
    for (int i = s.first_layer; i < s.first_layer + s.num_layers; ++i) {
      if (!kinds.empty()) kinds += ",";
      absl::StrAppend(&kinds, engine::LayerKindName(job.model.layers[i].kind));
    }
    if (kinds.size() > 40) kinds = kinds.substr(0, 37) + "...";
    absl::StrAppendFormat(
        &out, "%-6d %-6d %-12s %-40s %12d\n", s.stage, s.rank,
        absl::StrCat(s.first_layer, "-", s.first_layer + s.num_layers - 1),
        kinds, s.num_params);
  }
  absl::StrAppendFormat(&out, "actions per step: %d over %d rank(s)\n",
                        plan.schedule.TotalActions(), plan.num_ranks);
  if (plan.eval_schedule.has_value()) {
    absl::StrAppendFormat(
        &out,
        "eval: %s, %d batch(es) of %d (%d forward-only microbatches, %d "
        "actions)\n",
        job.eval.every > 0 ? absl::StrCat("after every ", job.eval.every,
                                          " step(s) and the last")
                           : std::string("after the last step"),
        job.eval.batches, job.training.batch_size,
        plan.eval_schedule->microbatches, plan.eval_schedule->TotalActions());
  }
  if (plan.auto_split.has_value()) {
    out += DescribeAutoSplit(plan);
  } else if (plan.job.pipeline.auto_stages) {
    out +=
        "stages: auto; the cut above is provisional until the layers are "
        "profiled\n";
  }
  return out;
}

std::string ScheduleChoice(const JobPlan& plan) {
  if (!plan.auto_split.has_value() || plan.auto_split->candidates.empty()) {
    return "";
  }
  const AutoSplitPlan& a = *plan.auto_split;
  const std::string& chosen = plan.job.pipeline.schedule;
  const ScheduleCandidate* runner_up = nullptr;
  for (const ScheduleCandidate& c : a.candidates) {
    if (!c.search.has_value() ||
        (c.schedule == chosen && c.virtual_stages == plan.virtual_stages)) {
      continue;
    }
    if (runner_up == nullptr ||
        c.search->makespan < runner_up->search->makespan) {
      runner_up = &c;
    }
  }
  std::string out = absl::StrFormat(
      "%s V=%d of %d candidates: the shortest predicted step%s", chosen,
      plan.virtual_stages, a.candidates.size(),
      plan.job.pipeline.memory_budget_bytes > 0 ? " within the memory budget"
                                                : "");
  if (runner_up != nullptr && runner_up->search->makespan > 0) {
    const double shorter = 1 - a.search.makespan / runner_up->search->makespan;
    // Within 1e-9 is ChooseSchedule's tie.
    if (shorter <= 1e-9) {
      absl::StrAppendFormat(&out,
                            ", tied with %s V=%d (the one listed first "
                            "wins)",
                            runner_up->schedule, runner_up->virtual_stages);
    } else {
      absl::StrAppendFormat(&out, ", %.2f%% shorter than %s V=%d",
                            shorter * 100, runner_up->schedule,
                            runner_up->virtual_stages);
    }
  }
  return out;
}

}  // namespace conveyor::job
