#include "worker/model_profile.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/profiler.h"
#include "spdlog/spdlog.h"
#include "transport/tcp/loopback_latency.h"

namespace conveyor::worker {
namespace {

// Transfers timed for a profile's transfer latency: 20 x 4 ms idle.
constexpr int kTransferSamples = 20;

}  // namespace

absl::StatusOr<ProfiledJob> ProfileJobModel(
    const v1::ProfileModel& request, DeviceBackends* backends,
    absl::Span<const std::string> devices) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(
      job::ParsedJob parsed,
      job::ParseJob(request.yaml(), request.file_name(), request.base_dir()));
  const job::JobSpec& spec = parsed.spec;
  // Profiled where the job will run: on this worker's device.
  engine::Backend* backend = engine::CpuBackend::Get(spec.training.precision);
  if (backends != nullptr) {
    ASSIGN_OR_RETURN(backend, backends->Get(spec.training.precision));
  }
  std::vector<engine::LayerProfile> layers;
  try {  // As for a job: one too large fails, not the worker.
    ASSIGN_OR_RETURN(
        layers,
        engine::ProfileLayers(
            backend, spec.model,
            {.microbatch_size = spec.training.microbatch_size(),
             .repetitions = std::clamp(request.repetitions(), 1, 100)}));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "out of host memory (std::bad_alloc) while profiling: the job's "
        "model is too large for this worker");
  }
  ProfiledJob out;
  v1::ModelProfile& p = out.profile;
  p.set_job_id(request.job_id());
  p.set_device(absl::StrJoin(devices, ","));
  // What a transfer costs here; a schedule: auto job's choice depends on
  // it when its layers are short. Not measured is not fatal: 0.
  // Host memory, as the data plane's TCP transfers are timed everywhere.
  absl::StatusOr<double> transfer = transport::MeasureLoopbackLatency(
      engine::CpuBackend::Get(), kTransferSamples,
      std::chrono::milliseconds(4));
  if (transfer.ok()) {
    p.set_transfer_seconds(*transfer);
  } else {
    SPDLOG_WARN("{}: no transfer latency for the planner: {}", request.job_id(),
                transfer.status().ToString());
  }
  for (const engine::LayerProfile& l : layers) {
    v1::LayerCost* c = p.add_layers();
    c->set_forward_seconds(l.forward_seconds);
    c->set_backward_input_seconds(l.backward_input_seconds);
    c->set_backward_weight_seconds(l.backward_weight_seconds);
    c->set_activation_bytes(l.activation_bytes);
    c->set_parameter_bytes(l.parameter_bytes);
  }
  p.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count());
  out.parsed = std::make_shared<const job::ParsedJob>(std::move(parsed));
  return out;
}

}  // namespace conveyor::worker
