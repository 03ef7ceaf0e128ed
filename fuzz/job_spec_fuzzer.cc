// Fuzz target for job files (job/job_spec.h), which anyone who may submit
// a job hands to the coordinator: the input is the YAML text. A job that
// parses is planned (job/planner.h), as the coordinator does at
// submission; the planner is pure, and with `stages: auto` it only makes the
// provisional cut (no profiling), so nothing here runs a model.
//
// Errors must be InvalidArgument, and a plan must be consistent with itself;
// a broken property aborts, which libFuzzer reports as a crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "job/job_spec.h"
#include "job/planner.h"

namespace {

// PlanJob generates one step's schedule, which the schedule library bounds at
// scheduler::kMaxStageMicrobatches (2^25) (stage, microbatch) pairs: a
// legitimate but large job costs seconds and gigabytes there, which is work,
// not a parser bug. Fuzz iterations plan jobs up to this many pairs.
constexpr int64_t kMaxFuzzStageMicrobatches = int64_t{1} << 16;

[[noreturn]] void Fail(const char* what, absl::string_view detail = "") {
  std::fprintf(stderr, "job_spec_fuzzer: property violated: %s %.*s\n", what,
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

void CheckPlan(const conveyor::job::JobPlan& plan) {
  const conveyor::job::JobSpec& job = plan.job;
  if (plan.num_stages != plan.num_ranks * plan.virtual_stages ||
      plan.num_stages != job.model.num_stages ||
      plan.stages.size() != static_cast<size_t>(plan.num_stages)) {
    Fail("stage counts disagree");
  }
  if (plan.schedule.actions.size() != static_cast<size_t>(plan.num_ranks)) {
    Fail("schedule has the wrong number of ranks");
  }
  // The stages cover the layers in order, each at least one layer.
  int next = 0;
  for (const conveyor::job::StagePlan& s : plan.stages) {
    if (s.first_layer != next || s.num_layers < 1 ||
        s.rank != s.stage % plan.num_ranks) {
      Fail("stages do not tile the layers");
    }
    next += s.num_layers;
  }
  if (next != static_cast<int>(job.model.layers.size())) {
    Fail("stages do not cover the layers");
  }
  if (conveyor::job::NeedsProfile(plan) != job.pipeline.auto_stages) {
    Fail("NeedsProfile disagrees with stages: auto");
  }
  if (conveyor::job::DescribePlan(plan).empty()) {
    Fail("empty plan description");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // LoadJobSpec refuses larger files before parsing.
  if (size > static_cast<size_t>(conveyor::job::kMaxJobFileBytes)) {
    return 0;
  }
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<conveyor::job::JobSpec> job =
      conveyor::job::ParseJobSpec(text, "fuzz.yaml");
  if (!job.ok()) {
    if (job.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("ParseJobSpec error is not InvalidArgument", job.status().message());
    }
    return 0;
  }
  const int64_t stages = job->pipeline.auto_stages ? job->pipeline.num_stages
                                                   : job->model.num_stages;
  if (stages * job->training.microbatches > kMaxFuzzStageMicrobatches) {
    return 0;
  }
  absl::StatusOr<conveyor::job::JobPlan> plan =
      conveyor::job::PlanJob(*std::move(job));
  if (!plan.ok()) {
    if (plan.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("PlanJob error is not InvalidArgument", plan.status().message());
    }
    return 0;
  }
  CheckPlan(*plan);
  return 0;
}
