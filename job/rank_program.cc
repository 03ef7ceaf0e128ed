#include "job/rank_program.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model_spec.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/protocol.h"
#include "scheduler/schedule.h"

namespace conveyor::job {
namespace {

absl::Status Mismatch(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("program/build mismatch: ", what,
                   " (the coordinator and this worker run different builds "
                   "or model code; refusing to train something else)"));
}

// The first difference between two programs, field by field, shortened:
// an action list differs in one entry, not in every one after it.
std::string FirstDifference(const v1::JobProgram& planned,
                            const v1::JobProgram& received) {
  std::string report;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&report);
  differ.Compare(planned, received);
  const size_t line_end = report.find('\n');
  if (line_end != std::string::npos) report.resize(line_end);
  constexpr size_t kMaxShown = 300;
  if (report.size() > kMaxShown) report = report.substr(0, kMaxShown) + "...";
  return report;
}

}  // namespace

std::set<int> CheckpointStagesOf(const JobPlan& plan, int rank,
                                 const std::vector<int>& checkpoint_begin) {
  std::vector<int> begin = checkpoint_begin;
  if (begin.empty()) {
    for (const StagePlan& s : plan.stages) begin.push_back(s.first_layer);
  }
  // Each parameter's checkpoint stage: the one holding the layer that owns
  // it (a tied copy's original, for a tied copy).
  absl::flat_hash_map<std::string, int> stage_of;
  for (const engine::LayerSpec& layer : plan.job.model.layers) {
    const int stage = static_cast<int>(
        std::upper_bound(begin.begin(), begin.end(), layer.index) -
        begin.begin() - 1);
    for (const engine::ParamSpec& p : layer.params) {
      if (!p.tied_copy) stage_of.try_emplace(p.name, stage);
    }
  }
  std::set<int> wanted;
  for (const StagePlan* s : StagesOfRank(plan, rank)) {
    for (const std::string& name : s->parameter_names) {
      auto it = stage_of.find(name);
      if (it != stage_of.end()) wanted.insert(it->second);
    }
  }
  return wanted;
}

v1::JobProgram CompileRankProgram(const JobPlan& plan, int rank,
                                  const ProgramContext& context) {
  v1::JobProgram program;
  program.set_job_id(context.job_id);
  program.set_job_number(context.job_number);
  program.set_secret(context.secret);
  program.set_yaml(context.yaml);
  program.set_file_name(context.file_name);
  program.set_base_dir(context.base_dir);
  program.set_rank(rank);
  program.set_num_ranks(plan.num_ranks);
  program.set_num_stages(plan.num_stages);
  program.set_schedule(
      std::string(scheduler::ScheduleKindName(plan.schedule.kind)));
  program.set_virtual_stages(plan.virtual_stages);
  for (const StagePlan* s : StagesOfRank(plan, rank)) {
    v1::StageProgram* sp = program.add_stages();
    sp->set_stage(s->stage);
    sp->set_first_layer(s->first_layer);
    sp->set_num_layers(s->num_layers);
    for (const std::string& name : s->parameter_names) {
      sp->add_parameter_names(name);
    }
  }
  if (rank >= 0 && rank < static_cast<int>(plan.schedule.actions.size())) {
    for (const scheduler::Action& a : plan.schedule.actions[rank]) {
      proto::ToProto(a, program.add_actions());
    }
  }
  if (plan.eval_schedule.has_value() && rank >= 0 &&
      rank < static_cast<int>(plan.eval_schedule->actions.size())) {
    for (const scheduler::Action& a : plan.eval_schedule->actions[rank]) {
      proto::ToProto(a, program.add_eval_actions());
    }
  }
  program.set_relayout(context.relayout);
  program.set_steps(plan.job.training.steps);
  program.set_recv_timeout_ms(context.recv_timeout_ms);
  program.set_checkpoint_dir(plan.job.checkpoint.dir);
  for (const StagePlan& s : plan.stages) {
    program.add_stage_begin(s.first_layer);
  }
  if (context.resume_step > 0) {
    program.set_resume_step(context.resume_step);
    program.set_resume_dir(context.resume_dir);
    for (int b : context.resume_stage_begin) {
      program.add_resume_stage_begin(b);
    }
    const std::set<int> wanted =
        CheckpointStagesOf(plan, rank, context.resume_stage_begin);
    for (const v1::StageFile& f : context.resume_files) {
      if (wanted.contains(f.stage())) *program.add_resume_files() = f;
    }
  }
  return program;
}

ProgramContext ContextOf(const v1::JobProgram& program) {
  return {.job_id = program.job_id(),
          .job_number = program.job_number(),
          .secret = program.secret(),
          .yaml = program.yaml(),
          .file_name = program.file_name(),
          .base_dir = program.base_dir(),
          .recv_timeout_ms = program.recv_timeout_ms(),
          .resume_step = program.resume_step(),
          .resume_dir = program.resume_dir(),
          .resume_files = {program.resume_files().begin(),
                           program.resume_files().end()},
          .resume_stage_begin = {program.resume_stage_begin().begin(),
                                 program.resume_stage_begin().end()},
          .relayout = program.relayout()};
}

absl::StatusOr<JobPlan> PlanOfProgram(const v1::JobProgram& program,
                                      const ParsedJob* parsed) {
  const int p = program.num_ranks(), s = program.num_stages();
  if (p < 1 || program.rank() < 0 || program.rank() >= p || s < p ||
      s % p != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("program: rank ", program.rank(), " of ", p,
                     " ranks with ", s, " stages is inconsistent"));
  }
  if (program.steps() < 0 || program.recv_timeout_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "program: steps (", program.steps(), ") and recv_timeout_ms (",
        program.recv_timeout_ms(), ") must not be negative"));
  }
  if (program.resume_step() < 0 || program.resume_step() > program.steps()) {
    return absl::InvalidArgumentError(
        absl::StrCat("program: resume_step ", program.resume_step(),
                     " is outside [0, ", program.steps(), "]"));
  }
  // The same parser the coordinator validated the job with, so both sides
  // read the same model, data and optimizer from the same text.
  JobSpec spec;
  if (parsed != nullptr && parsed->yaml == program.yaml() &&
      parsed->file_name == program.file_name() &&
      parsed->base_dir == program.base_dir()) {
    spec = parsed->spec;
  } else {
    ASSIGN_OR_RETURN(spec, ParseJobSpec(program.yaml(), program.file_name(),
                                        program.base_dir()));
  }
  if (program.relayout() && spec.pipeline.auto_schedule) {
    // Elastic: chosen for the workers the job had left.
    spec.pipeline.workers = program.num_ranks();
  }
  if (spec.pipeline.auto_schedule) {
    // The coordinator chose the schedule; the YAML says "auto".
    if (!scheduler::ParseScheduleKind(program.schedule()).ok() ||
        program.virtual_stages() < 1 ||
        program.num_stages() !=
            spec.pipeline.workers * int64_t{program.virtual_stages()}) {
      return absl::InvalidArgumentError(absl::StrCat(
          "program: schedule: auto needs the chosen schedule and virtual "
          "stages for ",
          spec.pipeline.workers, " workers; got '", program.schedule(),
          "', V = ", program.virtual_stages(), ", ", program.num_stages(),
          " stages"));
    }
    spec.pipeline.schedule = program.schedule();
    spec.pipeline.virtual_stages = program.virtual_stages();
    spec.pipeline.num_stages = program.num_stages();
  }
  absl::StatusOr<JobPlan> plan;
  if (spec.pipeline.auto_stages || program.relayout()) {
    // The coordinator chose the cut from a profile, or merged the file's
    // stages for fewer workers (elastic); the YAML says otherwise.
    absl::StatusOr<StageCut> cut = StageCut::Create(
        {program.stage_begin().begin(), program.stage_begin().end()},
        static_cast<int>(spec.model.layers.size()));
    plan = cut.ok() ? PlanWithCut(std::move(spec), *cut)
                    : absl::InvalidArgumentError(absl::StrCat(
                          "stage_begin: ", cut.status().message()));
  } else {
    plan = PlanJob(std::move(spec));
  }
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("program: ", plan.status().message()));
  }
  const v1::JobProgram compiled =
      CompileRankProgram(*plan, program.rank(), ContextOf(program));
  if (!google::protobuf::util::MessageDifferencer::Equals(compiled, program)) {
    return Mismatch(absl::StrCat("the program differs from this build's plan: ",
                                 FirstDifference(compiled, program)));
  }
  return plan;
}

}  // namespace conveyor::job
