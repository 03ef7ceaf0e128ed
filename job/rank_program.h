// A rank's program: what the coordinator sends one worker to run its part of
// a job, compiled from the job's plan (job/planner.h). The coordinator
// compiles every rank's; the worker compiles its own again from the same
// YAML and cut and refuses a program that differs, so both sides run the
// same stages, parameters and actions by construction rather than by a
// field-by-field comparison that must be kept in step with the program.
//
// Thread-safe (pure functions).
#ifndef CONVEYOR_JOB_RANK_PROGRAM_H_
#define CONVEYOR_JOB_RANK_PROGRAM_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "conveyor/v1/conveyor.pb.h"
#include "job/job_spec.h"
#include "job/parsed_job.h"
#include "job/planner.h"

namespace conveyor::job {

// What a program carries besides the plan: the job's identity and source,
// the coordinator's settings, and where the attempt resumes.
struct ProgramContext {
  std::string job_id{};
  // Unique per attempt (the job's number and its restarts): a restarted
  // job's data plane never accepts a tensor of the attempt before it.
  uint64_t job_number = 0;
  std::string secret{};
  std::string yaml{}, file_name{}, base_dir{};
  int64_t recv_timeout_ms = 0;
  // 0: from the init. resume_files: every stage's file of the checkpoint,
  // or this rank's; resume_stage_begin: the checkpoint's cut (empty: the
  // plan's). The program keeps the files that hold the parameters of the
  // rank's stages, the originals of its tied copies included
  // (engine::TiedParameter), whatever cut wrote them.
  int64_t resume_step = 0;
  std::string resume_dir{};
  std::vector<v1::StageFile> resume_files{};
  std::vector<int> resume_stage_begin{};
  // The plan is an elastic relayout (JobProgram.relayout).
  bool relayout = false;
};

// The stages of a checkpoint cut at `checkpoint_begin` (first layers; empty:
// the plan's own cut) whose files hold the parameters of rank `rank`'s
// stages in `plan`, the originals of its tied copies included.
std::set<int> CheckpointStagesOf(const JobPlan& plan, int rank,
                                 const std::vector<int>& checkpoint_begin);

// Rank `rank`'s program for `plan` (0 <= rank < plan.num_ranks).
v1::JobProgram CompileRankProgram(const JobPlan& plan, int rank,
                                  const ProgramContext& context);

// The context `program` was compiled with.
ProgramContext ContextOf(const v1::JobProgram& program);

// The worker's side: parses the program's YAML (once; the caller keeps the
// plan) unless `parsed` is that file already parsed in this process (the
// same text, file name and base directory: the job's profiling parsed it),
// cuts a `stages: auto` model where the program says, plans it, and checks
// that compiling the plan for the program's rank gives the program.
// InvalidArgument for a program inconsistent in itself or a job that does
// not parse or plan; FailedPrecondition "program/build mismatch: <first
// difference>" when the coordinator planned something else (another build
// or other model code).
absl::StatusOr<JobPlan> PlanOfProgram(const v1::JobProgram& program,
                                      const ParsedJob* parsed = nullptr);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_RANK_PROGRAM_H_
