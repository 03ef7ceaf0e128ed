#include "cli/run_command.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/job_spec.h"
#include "engine/trainer.h"

namespace conveyor::cli {

CLI::App* AddRunCommand(CLI::App& app, RunCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Train a job. With --in-process, every stage runs in turn in "
      "this process: the numerical reference for pipelined runs");
  cmd->add_option("job", o.job_file, "Job YAML file")->required();
  cmd->add_flag("--in-process", o.in_process,
                "Train in this process (no daemons)");
  cmd->add_option("--steps", o.steps,
                  "Override training.steps (0: as in the job)");
  cmd->add_option("--log-every", o.log_every, "Print every N-th step")
      ->capture_default_str();
  return cmd;
}

absl::Status RunRunCommand(const RunCommandOptions& o, std::ostream& out) {
  if (!o.in_process) {
    return absl::InvalidArgumentError(
        "run: training on daemons (an embedded local cluster) is not built "
        "yet; pass --in-process to train in this process");
  }
  if (o.steps < 0 || o.log_every < 1) {
    return absl::InvalidArgumentError(
        "run: --steps must be >= 0 and --log-every >= 1");
  }
  ASSIGN_OR_RETURN(engine::JobSpec job, engine::LoadJobSpec(o.job_file));
  if (o.steps > 0) job.training.steps = o.steps;
  engine::Backend* backend = engine::CpuBackend::Get();
  // Create the checkpoint directory first: a run that cannot write its
  // result should fail before training, not after.
  if (!job.checkpoint.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(job.checkpoint.dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create checkpoint.dir ", job.checkpoint.dir,
                       ": ", ec.message()));
    }
    if (job.checkpoint.every > 0 || job.checkpoint.keep_latest > 0) {
      out << "note: checkpoint.every and keep_latest are not used by "
             "--in-process; only the final parameters are written\n";
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<engine::InProcessTrainer> trainer,
                   engine::InProcessTrainer::Create(backend, job));
  out << absl::StrFormat(
      "job %s: %d layers in %d stage(s), %d parameters; %d steps of batch %d "
      "in %d microbatches, in process on %s\n",
      job.name, job.model.layers.size(), job.model.num_stages,
      job.model.NumParams(), job.training.steps, job.training.batch_size,
      job.training.microbatches, backend->Name());
  out.flush();
  const int64_t total = job.training.steps;
  RETURN_IF_ERROR(trainer->Run([&](const engine::StepReport& r) {
    if (r.step % o.log_every != 0 && r.step != total) return;
    out << absl::StrFormat(
        "step %*d/%d  loss %.6f  lr %.3g  %.1f ms  %.0f samples/s\n",
        static_cast<int>(absl::StrCat(total).size()), r.step, total, r.loss,
        r.learning_rate, r.seconds * 1e3, r.samples_per_second);
    out.flush();
  }));
  if (!job.checkpoint.dir.empty()) {
    const std::string path =
        (std::filesystem::path(job.checkpoint.dir) / "params.safetensors")
            .string();
    RETURN_IF_ERROR(trainer->SaveParameters(path));
    out << "final parameters: " << path << "\n";
  }
  return absl::OkStatus();
}

}  // namespace conveyor::cli
