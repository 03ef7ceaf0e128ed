// conveyor-worker: the worker daemon. Registers with the coordinator, runs
// the stages it is given, and streams activations and gradients to the
// other workers of each job.
//
// Exit codes: 0 after SIGTERM/SIGINT (the first drains the worker; see
// main), 1 when the coordinator refuses the registration (version skew) or
// the daemon cannot start, 2 for invalid arguments.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"              // defines: CLI::App, CLI::ParseError
#include "absl/cleanup/cleanup.h"   // defines: absl::Cleanup
#include "absl/status/status.h"     // defines: absl::Status
#include "absl/strings/str_cat.h"   // defines: absl::StrCat
#include "absl/strings/str_join.h"  // defines: absl::StrJoin
#include "common/auth_token.h"      // defines: ReadAuthTokenFile
#include "common/build_info.h"      // defines: kVersion, kGitRevision, ...
#include "common/command_line.h"
#include "common/cpu_set.h"          // defines: ParseCpuList, PinProcess
#include "common/logging.h"          // defines: InitLogging, kLogLevels
#include "common/open_file_limit.h"  // defines: RaiseOpenFileLimit
#include "engine/cpu/parallel.h"     // defines: SetCpuThreads
#include "proto/credentials.h"       // defines: MakeChannelCredentials
#include "proto/grpc_diagnostics.h"  // defines: RouteGrpcLogs, ClientTls
#include "spdlog/spdlog.h"           // defines: SPDLOG_INFO, ...
#include "telemetry/daemon_metrics.h"
#include "telemetry/metrics_server.h"
#include "worker/session.h"  // defines: WorkerSession
#include "worker/worker_metrics.h"

namespace {

constexpr int kExitFailure = 1;

// The thread that sigwaits for SIGTERM/SIGINT. Blocking the signals in main
// covers every thread main creates, but not those started before main:
// OpenBLAS starts its thread pool when the library is loaded. A
// process-directed signal may be delivered to one of those; this handler
// passes it on to the signal thread (pthread_kill is async-signal-safe).
pthread_t g_signal_thread;
std::atomic<bool> g_forward_signals{false};

extern "C" void ForwardSignal(int signal_number) {
  if (g_forward_signals.load()) pthread_kill(g_signal_thread, signal_number);
}

void SetShutdownSignalsAction(void (*handler)(int)) {
  struct sigaction action = {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

std::string VersionText() {
  return absl::StrCat("conveyor-worker ", conveyor::kVersion, " (revision ",
                      conveyor::kGitRevision, ", ", conveyor::kBuildType,
                      ", CUDA ",
                      conveyor::kBuiltWithCuda ? "built" : "not built", ")");
}

std::string DefaultName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(host[0] != '\0' ? host : "localhost", ":", getpid());
}

// "host:port" with a port in [0, 65535]; the host is checked when a job
// binds it.
absl::Status CheckAddress(absl::string_view flag, const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    const char* begin = address.data() + colon + 1;
    const char* end = address.data() + address.size();
    auto [ptr, ec] = std::from_chars(begin, end, port);
    if (ec != std::errc() || ptr != end || begin == end) port = -1;
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", address,
                     "' is not host:port (IPv6 as [::1]:port; port 0..65535)"));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  // Block the shutdown signals before any thread exists, so every thread
  // (gRPC's, the data plane's) inherits the mask and only the signal thread
  // below receives them, with sigwait, where it may do real work.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A peer that closes a socket mid-write must fail the write, not kill us.
  signal(SIGPIPE, SIG_IGN);

  CLI::App app{
      "conveyor-worker: a Conveyor worker daemon; registers with the "
      "coordinator and runs the pipeline stages it is given"};
  app.set_version_flag("--version", VersionText());
  conveyor::worker::SessionOptions options;
  std::string metrics_address;
  std::string log_level = "info";
  options.name = DefaultName();
  // Every core the worker may use, as many threads: a worker that owns
  // fewer says cpu:N or --cpu-cores.
  options.devices = {"cpu"};
  app.add_option("--coordinator", options.coordinator,
                 "The coordinator's host:port")
      ->envname("CONVEYOR_COORDINATOR")
      ->capture_default_str();
  app.add_option(
         "--devices", options.devices,
         "The devices to compute on, comma-separated or in repeated flags: "
         "cpu:N (the CPU: kernels and BLAS run N threads); cpu (every core "
         "this process may use: --cpu-cores, taskset or the cgroup's); "
         "cpu:N,cpu:N,... (a CPU mesh of that many devices sharing the "
         "CPU, for development); cuda:K (GPU ordinal K); "
         "cuda:K,L,... or cuda:K,cuda:L,... (a mesh of those GPUs). CUDA "
         "comes from libconveyor_cuda.so next to this binary, or the file "
         "CONVEYOR_CUDA_PLUGIN names")
      ->delimiter(',')
      ->capture_default_str();
  std::string cpu_cores;
  app.add_option("--cpu-cores", cpu_cores,
                 "Pin the worker (all its threads) to these cores, a Linux "
                 "cpu list such as 0-3,8: a CPU worker's share of a machine "
                 "it shares (conveyorctl run gives each local worker one); "
                 "empty: no pinning")
      ->envname("CONVEYOR_CPU_CORES");
  app.add_option("--data-address", options.data_address,
                 "host:port each job's data plane listens on (port 0: a free "
                 "port per job; host 0.0.0.0: all interfaces, advertised as "
                 "this machine's host name)")
      ->capture_default_str();
  app.add_option("--metrics-address", metrics_address,
                 "host:port to serve Prometheus /metrics on (port 0: a free "
                 "port, reported to the coordinator); empty: not served");
  app.add_option("--name", options.name,
                 "This worker's name as the coordinator lists it")
      ->capture_default_str();
  double peak_tflops = 0;
  app.add_option("--peak-tflops", peak_tflops,
                 "Peak TFLOP/s of one of its devices at the precision jobs "
                 "run in (a datasheet figure, or a measured GEMM rate for a "
                 "CPU), for the model FLOPs utilisation its jobs report "
                 "(conveyor_job_mfu_ratio); 0: a GPU's own figure from its "
                 "SM count, clock and architecture at the job's precision, "
                 "and no MFU on a CPU")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  std::string auth_token_file;
  app.add_option("--auth-token-file", auth_token_file,
                 "File holding the cluster's shared token, presented to the "
                 "coordinator and keying the data-plane handshake (every "
                 "worker of a cluster needs the same one)");
  conveyor::proto::TlsFiles tls;
  app.add_option("--tls-ca", tls.ca,
                 "PEM CA that signed the coordinator's certificate: connect "
                 "with TLS");
  app.add_option("--tls-cert", tls.cert,
                 "PEM client certificate, for a coordinator that requires "
                 "one (with --tls-key)");
  app.add_option("--tls-key", tls.key, "PEM private key of --tls-cert");
  app.add_option("--log-level", log_level,
                 absl::StrCat("Log level: ", conveyor::kLogLevels))
      ->capture_default_str();
  double drain_timeout_seconds = 25;
  app.add_option(
         "--drain-timeout", drain_timeout_seconds,
         "Seconds a SIGTERM/SIGINT drain may take (the job checkpoints at the "
         "next step boundary and moves to other workers) before the worker "
         "shuts down anyway; keep it under the grace your supervisor allows "
         "(Kubernetes and Slurm: 30 s by default); 0: no drain, shut down at "
         "once")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  // Exists only for tests: fault injection for the integration tests that
  // kill a worker mid-checkpoint (tests/integration/daemons_test.cc), which
  // pause it before each stage file (SessionOptions::TEST_checkpoint_delay).
  // Hidden from --help (empty group): not for users.
  int64_t checkpoint_delay_ms = 0;
  app.add_option("--fault-checkpoint-delay-ms", checkpoint_delay_ms)
      ->envname("CONVEYOR_FAULT_CHECKPOINT_DELAY_MS")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}))
      ->group("");

  if (std::optional<int> exit = conveyor::ParseCommandLine(
          app, argc, argv, "conveyor-worker", &log_level);
      exit.has_value()) {
    return *exit;
  }
  conveyor::proto::RouteGrpcLogs(conveyor::proto::GrpcLogs::kDaemon);
  // Data-plane peers, checkpoint files and scrapers: up to the hard limit.
  conveyor::RaiseOpenFileLimit();
  // Pinned first: `cpu` counts the cores the process may use, and every
  // thread started from here on inherits the mask.
  std::vector<int> pinned;
  if (!cpu_cores.empty()) {
    absl::StatusOr<std::vector<int>> cores = conveyor::ParseCpuList(cpu_cores);
    absl::Status pin = cores.status();
    if (pin.ok()) pin = conveyor::PinProcess(*cores);
    if (pin.code() == absl::StatusCode::kInvalidArgument) {
      std::cerr << "conveyor-worker: --cpu-cores " << cpu_cores << ": "
                << pin.message() << "\n";
      return conveyor::kExitUsage;
    }
    if (pin.ok()) {
      pinned = *std::move(cores);
    } else {
      // Pinned where the OS allows: a container may forbid it, and the
      // worker is still useful unpinned.
      SPDLOG_WARN("--cpu-cores {}: not pinned: {}", cpu_cores,
                  std::string(pin.message()));
    }
  }
  absl::StatusOr<std::unique_ptr<conveyor::worker::DeviceBackends>> backends =
      conveyor::worker::DeviceBackends::Create(options.devices);
  absl::Status valid = backends.status();
  options.peak_flops_per_device = peak_tflops * 1e12;
  if (valid.ok()) valid = CheckAddress("--coordinator", options.coordinator);
  if (valid.ok()) valid = CheckAddress("--data-address", options.data_address);
  if (valid.ok() && !metrics_address.empty()) {
    valid = CheckAddress("--metrics-address", metrics_address);
  }
  if (valid.ok() && !auth_token_file.empty()) {
    absl::StatusOr<std::string> token =
        conveyor::ReadAuthTokenFile(auth_token_file);
    if (token.ok()) {
      options.auth_token = *std::move(token);
      if (const std::string warning =
              conveyor::AuthTokenFileWarning(auth_token_file);
          !warning.empty()) {
        SPDLOG_WARN("{}", warning);
      }
    } else {
      valid = absl::InvalidArgumentError(
          absl::StrCat("--auth-token-file: ", token.status().message()));
    }
  }
  conveyor::proto::TlsFilesReport tls_report;
  if (valid.ok()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        conveyor::proto::MakeChannelCredentials(tls, &tls_report);
    if (credentials.ok()) {
      options.credentials = *std::move(credentials);
      options.tls = {.tls = !tls.ca.empty(), .client_cert = !tls.cert.empty()};
    } else {
      valid = absl::InvalidArgumentError(credentials.status().message());
    }
  }
  if (!valid.ok()) {
    std::cerr << "conveyor-worker: " << valid.message() << "\n";
    return valid.code() == absl::StatusCode::kFailedPrecondition
               ? kExitFailure
               : conveyor::kExitUsage;
  }
  // A GPU worker opens its devices now: one that cannot use them must not
  // register and be handed jobs.
  for (int d = 0; d < (*backends)->size(); ++d) {
    if (absl::StatusOr<conveyor::engine::Backend*> device =
            (*backends)->Get(d, conveyor::engine::Precision::kFp32);
        !device.ok()) {
      std::cerr << "conveyor-worker: --devices: " << device.status().message()
                << "\n";
      return kExitFailure;
    }
  }
  options.backends = backends->get();
  options.devices = (*backends)->spelled_out();
  // A CPU worker's kernels and OpenBLAS run as many threads as its devices
  // have cores, so workers sharing a machine do not oversubscribe it.
  if (const int threads = (*backends)->cpu_threads(); threads > 0) {
    conveyor::engine::SetCpuThreads(threads);
    if (absl::StatusOr<std::vector<int>> cores = conveyor::AllowedCpus();
        cores.ok() && threads > static_cast<int>(cores->size())) {
      SPDLOG_WARN(
          "--devices asks for {} CPU threads but this worker may run on {} "
          "core(s) ({}): they will share cores, and spinning BLAS threads "
          "slow each other down",
          threads, cores->size(), conveyor::FormatCpuList(*cores));
    }
  }

  options.TEST_checkpoint_delay =
      std::chrono::milliseconds(checkpoint_delay_ms);
  if (checkpoint_delay_ms > 0) {
    SPDLOG_WARN("fault injection: pausing {} ms before each checkpoint file",
                checkpoint_delay_ms);
  }

  // Served before registering, so the coordinator learns the bound address.
  conveyor::worker::WorkerMetrics metrics(options.name);
  for (const std::string& warning : tls_report.warnings) {
    SPDLOG_WARN("{}", warning);
  }
  for (const conveyor::proto::CertificateValidity& c :
       tls_report.certificates) {
    conveyor::telemetry::AddCertificateExpiry(
        *metrics.registry(), c.flag, c.path, c.subject, c.not_after_unix);
  }
  auto process = std::make_shared<conveyor::telemetry::ProcessCollector>();
  // /readyz: registered with the coordinator. The session is made after
  // the server (which must be bound first), and the server is stopped
  // before the session goes.
  std::atomic<conveyor::worker::WorkerSession*> probed_session{nullptr};
  std::unique_ptr<conveyor::telemetry::MetricsServer> metrics_server;
  if (!metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<conveyor::telemetry::MetricsServer>> server =
        conveyor::telemetry::MetricsServer::Start(
            metrics_address, {metrics.registry(), process},
            [&probed_session]() -> conveyor::telemetry::Readiness {
              const conveyor::worker::WorkerSession* session =
                  probed_session.load();
              if (session == nullptr) return {false, "starting"};
              const conveyor::worker::WorkerSession::Standing standing =
                  session->standing();
              return {standing.registered, standing.detail};
            });
    if (!server.ok()) {
      std::cerr << "conveyor-worker: --metrics-address: "
                << server.status().message() << "\n";
      return kExitFailure;
    }
    metrics_server = *std::move(server);
    options.metrics_address = metrics_server->address();
    SPDLOG_INFO("serving metrics on http://{}/metrics",
                metrics_server->address());
  }
  options.metrics = &metrics;

  absl::StatusOr<std::unique_ptr<conveyor::worker::WorkerSession>> session =
      conveyor::worker::WorkerSession::Create(options);
  if (!session.ok()) {
    std::cerr << "conveyor-worker: " << session.status().message() << "\n";
    return conveyor::kExitUsage;
  }
  probed_session.store(session->get());
  // Whichever way main returns, the probes stop before the session goes.
  absl::Cleanup stop_probes = [&] {
    probed_session.store(nullptr);
    metrics_server.reset();
  };
  SPDLOG_INFO("{} starting as '{}' (devices {}{}), coordinator {}",
              VersionText(), options.name, absl::StrJoin(options.devices, ","),
              pinned.empty()
                  ? std::string()
                  : absl::StrCat(" on cores ", conveyor::FormatCpuList(pinned)),
              options.coordinator);

  // The first signal drains the worker: its job checkpoints at a step every
  // rank agrees on and moves to other workers, and then the coordinator
  // tells this worker to leave (what Slurm and Kubernetes send SIGTERM for).
  // A second signal, or the drain timeout, shuts down at once (the job is
  // cancelled and resumes from its newest checkpoint); a third, for a
  // shutdown that hangs, exits (with --drain-timeout 0: the first shuts
  // down, the second exits).
  std::atomic<bool> run_over{false};
  std::thread signal_thread([&] {
    int received = 0;
    int count = 0;
    std::optional<std::chrono::steady_clock::time_point> drain_deadline;
    while (true) {
      if (drain_deadline.has_value()) {
        const auto left = *drain_deadline - std::chrono::steady_clock::now();
        const auto ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
        timespec timeout{};
        timeout.tv_sec = std::max<int64_t>(ns, 0) / 1000000000;
        timeout.tv_nsec = std::max<int64_t>(ns, 0) % 1000000000;
        received = sigtimedwait(&signals, nullptr, &timeout);
        if (run_over.load()) return;
        if (received < 0) {
          if (errno != EAGAIN) continue;  // EINTR.
          SPDLOG_WARN(
              "the drain took longer than --drain-timeout ({} s): "
              "shutting down now",
              drain_timeout_seconds);
          drain_deadline.reset();
          ++count;
          (*session)->Shutdown();
          continue;
        }
      } else if (sigwait(&signals, &received) != 0) {
        continue;
      }
      if (run_over.load()) return;
      ++count;
      if (count == 1 && drain_timeout_seconds > 0) {
        SPDLOG_INFO("signal {}: draining (again, or after {} s: shut down now)",
                    received, drain_timeout_seconds);
        drain_deadline =
            std::chrono::steady_clock::now() +
            std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::duration<double>(drain_timeout_seconds));
        (*session)->Drain(absl::StrCat("signal ", received));
      } else if (count < (drain_timeout_seconds > 0 ? 3 : 2)) {
        SPDLOG_INFO("signal {}: shutting down", received);
        drain_deadline.reset();
        (*session)->Shutdown();
      } else {
        SPDLOG_WARN("signal {} again: exiting now", received);
        std::_Exit(kExitFailure);
      }
    }
  });
  g_signal_thread = signal_thread.native_handle();
  g_forward_signals.store(true);
  // Also replaces an inherited SIG_IGN (a shell's background job): the
  // daemon always stops on these.
  SetShutdownSignalsAction(ForwardSignal);

  absl::Status status;
  // Last resort for what a library may still throw (std::bad_alloc): a
  // message, not abort().
  try {
    status = (*session)->Run();
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  run_over.store(true);
  SetShutdownSignalsAction(SIG_IGN);
  g_forward_signals.store(false);
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (status.ok()) {
    SPDLOG_INFO("stopped");
    return 0;
  }
  if (status.code() == absl::StatusCode::kFailedPrecondition ||
      status.code() == absl::StatusCode::kUnauthenticated) {
    std::cerr << "conveyor-worker: the coordinator refused this worker: "
              << status.message() << "\n";
  } else {
    std::cerr << "conveyor-worker: " << status.message() << "\n";
  }
  return kExitFailure;
}
