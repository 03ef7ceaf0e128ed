// conveyor-coordinator: the control-plane daemon. Serves conveyor.v1's
// Coordinator (for conveyorctl) and WorkerSession (for workers) on one
// address, and runs the JobManager's clock (heartbeats, timeouts, queue).
//
// Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot start (address in
// use, unreadable config), 2 for invalid flags or config values.

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"             // flags
#include "absl/strings/str_cat.h"  // messages
#include "common/auth_token.h"     // ReadAuthTokenFile
#include "common/build_info.h"     // kVersion
#include "common/command_line.h"
#include "common/file.h"                      // ReadFile, WriteFileAtomically
#include "common/heap_tuning.h"               // TuneHeapForPlanning
#include "common/logging.h"                   // InitLogging
#include "common/open_file_limit.h"           // RaiseOpenFileLimit
#include "common/status_macros.h"             // ASSIGN_OR_RETURN
#include "common/yaml_reader.h"               // the --config file
#include "coordinator/coordinator_metrics.h"  // /metrics
#include "coordinator/fleet_summary.h"        // /readyz
#include "coordinator/job_manager.h"          // the state machine
#include "coordinator/scheduling_policy.h"    // ParseOwnerQuotas
#include "coordinator/service.h"              // the gRPC services
#include "coordinator/state_file.h"           // StateFile
#include "grpcpp/grpcpp.h"                    // ServerBuilder
#include "proto/answered_by.h"                // AnsweredByInterceptorFactory
#include "proto/credentials.h"                // MakeServerCredentials
#include "proto/grpc_diagnostics.h"           // RouteGrpcLogs
#include "proto/protocol.h"                   // kMaxMessageBytes
#include "spdlog/spdlog.h"                    // SPDLOG_*
#include "telemetry/daemon_metrics.h"         // ProcessCollector
#include "telemetry/metrics_server.h"         // MetricsServer

namespace {

constexpr int kExitFailure = 1;

struct Flags {
  std::string listen = "127.0.0.1:7070";
  double heartbeat_timeout = 10;  // Seconds.
  double recv_timeout = 30;       // Seconds.
  std::string metrics_address;
  std::string config;
  std::string ready_file;
  std::string auth_token_file;
  std::string state_file;
  conveyor::proto::TlsFiles tls;
  std::string log_level = "info";
  // Scheduling policy (docs/jobs.md "Priority and owner").
  std::string owner_quota;
  double aging_per_minute =
      conveyor::coordinator::JobQueue::kDefaultAgingPerMinute;
  bool no_preemption = false;
  // Test hooks (hidden flags): freeze before the manifest of this step.
  int64_t fault_commit_step = 0;
  int64_t fault_commit_delay_ms = 0;
};

// The optional YAML config file: the same settings as the flags; a flag
// given on the command line wins.
absl::Status ApplyConfigFile(const std::string& path, const CLI::App& app,
                             Flags& flags) {
  ASSIGN_OR_RETURN(std::string text, conveyor::ReadFile(path, 1 << 20));
  ASSIGN_OR_RETURN(
      YAML::Node doc,
      conveyor::LoadYaml(text, path, conveyor::YamlDocuments::kExactlyOne));
  conveyor::YamlReader reader(path);
  ASSIGN_OR_RETURN(
      conveyor::YamlMap map,
      reader.ReadMap(
          reader.Root(doc),
          {"listen", "heartbeat_timeout", "recv_timeout", "metrics_address",
           "state_file", "owner_quota", "aging_per_minute", "preemption"}));
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  for (const conveyor::YamlMapEntry& e : map.entries) {
    if (e.key == "listen" && !given("--listen")) {
      ASSIGN_OR_RETURN(flags.listen, reader.ParseString(e.value));
    } else if (e.key == "heartbeat_timeout" && !given("--heartbeat-timeout")) {
      ASSIGN_OR_RETURN(flags.heartbeat_timeout,
                       reader.ParsePositiveDouble(e.value));
    } else if (e.key == "recv_timeout" && !given("--recv-timeout")) {
      ASSIGN_OR_RETURN(flags.recv_timeout, reader.ParsePositiveDouble(e.value));
    } else if (e.key == "metrics_address" && !given("--metrics-address")) {
      ASSIGN_OR_RETURN(flags.metrics_address, reader.ParseString(e.value));
    } else if (e.key == "state_file" && !given("--state-file")) {
      ASSIGN_OR_RETURN(flags.state_file, reader.ParseString(e.value));
    } else if (e.key == "owner_quota" && !given("--owner-quota")) {
      ASSIGN_OR_RETURN(flags.owner_quota, reader.ParseString(e.value));
    } else if (e.key == "aging_per_minute" && !given("--aging-per-minute")) {
      ASSIGN_OR_RETURN(flags.aging_per_minute,
                       reader.ParseNonNegativeDouble(e.value));
    } else if (e.key == "preemption" && !given("--no-preemption")) {
      ASSIGN_OR_RETURN(const bool preemption, reader.ParseBool(e.value));
      flags.no_preemption = !preemption;
    }
  }
  return absl::OkStatus();
}

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread: plans reuse their buffers instead of faulting them
  // in afresh (common/heap_tuning.h).
  conveyor::TuneHeapForPlanning();
  CLI::App app{
      "conveyor-coordinator: Conveyor's control plane (job queue, planner, "
      "worker registry)"};
  app.set_version_flag(
      "--version",
      absl::StrCat("conveyor-coordinator ", conveyor::kVersion, " (revision ",
                   conveyor::kGitRevision, ", control protocol ",
                   conveyor::proto::kProtocolVersion, ")"));
  Flags flags;
  app.add_option("--listen", flags.listen,
                 "gRPC address host:port (port 0 picks a free one)")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", flags.heartbeat_timeout,
                 "Seconds of silence after which a worker is lost")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--recv-timeout", flags.recv_timeout,
                 "Seconds a worker waits for a tensor before failing the job")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option(
      "--metrics-address", flags.metrics_address,
      "host:port to serve Prometheus /metrics on (port 0: a free port, "
      "written to the ready file); empty: not served");
  app.add_option("--config", flags.config,
                 "YAML file with listen, heartbeat_timeout, recv_timeout, "
                 "metrics_address, state_file, owner_quota, "
                 "aging_per_minute, preemption (flags win)");
  app.add_option("--state-file", flags.state_file,
                 "Keep job records in this file so that they survive a "
                 "restart; empty: in memory only");
  app.add_option("--ready-file", flags.ready_file,
                 "Write the bound address here (atomically) once serving");
  app.add_option("--auth-token-file", flags.auth_token_file,
                 "File holding the cluster's shared token: every call "
                 "(conveyorctl's and workers') must present it");
  app.add_option("--tls-cert", flags.tls.cert,
                 "PEM certificate to serve TLS with (with --tls-key)");
  app.add_option("--tls-key", flags.tls.key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", flags.tls.ca,
                 "PEM CA: require client certificates it signed (mutual "
                 "TLS)");
  app.add_option("--owner-quota", flags.owner_quota,
                 "Workers each owner's jobs may hold at once, "
                 "OWNER=WORKERS[,OWNER=WORKERS...] (e.g. team-a=16,team-b=8); "
                 "owners not listed have no limit");
  app.add_option("--aging-per-minute", flags.aging_per_minute,
                 "Priority points a queued job gains per minute waited, so "
                 "low-priority jobs are not starved (classes are 100 apart; "
                 "0: no aging)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  app.add_flag("--no-preemption", flags.no_preemption,
               "Never drain running jobs for a queued job of higher "
               "priority");
  app.add_option("--log-level", flags.log_level,
                 absl::StrCat("Log level: ", conveyor::kLogLevels))
      ->capture_default_str();
  // Test hooks (JobManagerOptions::TEST_fault_commit_*): they exist only for
  // tests/integration/coordinator_restart_test.sh, which kills the
  // coordinator between a step's last stage file and its manifest: pause
  // before writing the manifest of that step. Hidden from --help (empty
  // group): not for users.
  app.add_option("--fault-commit-step", flags.fault_commit_step)
      ->envname("CONVEYOR_FAULT_COMMIT_STEP")
      ->check(CLI::NonNegativeNumber)
      ->group("");
  app.add_option("--fault-commit-delay-ms", flags.fault_commit_delay_ms)
      ->envname("CONVEYOR_FAULT_COMMIT_DELAY_MS")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}))
      ->group("");
  if (std::optional<int> exit = conveyor::ParseCommandLine(
          app, argc, argv, "conveyor-coordinator", &flags.log_level);
      exit.has_value()) {
    return *exit;
  }
  // Refused TLS handshakes (a plaintext client, a missing or foreign
  // client certificate) logged as warnings that say why, rate-limited.
  conveyor::proto::RouteGrpcLogs(conveyor::proto::GrpcLogs::kDaemon);
  // Workers' streams, watchers and scrapers: up to the hard limit.
  conveyor::RaiseOpenFileLimit();
  if (!flags.config.empty()) {
    if (absl::Status s = ApplyConfigFile(flags.config, app, flags); !s.ok()) {
      std::cerr << "conveyor-coordinator: --config: " << s.message() << "\n";
      return s.code() == absl::StatusCode::kInvalidArgument
                 ? conveyor::kExitUsage
                 : kExitFailure;
    }
  }

  absl::StatusOr<conveyor::coordinator::OwnerQuotas> quotas =
      conveyor::coordinator::ParseOwnerQuotas(flags.owner_quota);
  if (!quotas.ok()) {
    std::cerr << "conveyor-coordinator: " << quotas.status().message() << "\n";
    return conveyor::kExitUsage;
  }

  // Signals are taken by one thread with sigwait; every other thread
  // (gRPC's included, created later) inherits the blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Shared: the metrics server holds its collectables weakly.
  // Before anything is served: the records it holds decide the job ids.
  std::unique_ptr<conveyor::coordinator::StateFile> state_file;
  std::optional<conveyor::v1::CoordinatorState> saved;
  if (!flags.state_file.empty()) {
    absl::StatusOr<std::unique_ptr<conveyor::coordinator::StateFile>> opened =
        conveyor::coordinator::StateFile::Open(flags.state_file);
    absl::StatusOr<std::optional<conveyor::v1::CoordinatorState>> loaded =
        opened.ok() ? (*opened)->Load() : opened.status();
    if (!loaded.ok()) {
      std::cerr << "conveyor-coordinator: --state-file: "
                << loaded.status().message()
                << (absl::IsDataLoss(loaded.status())
                        ? " (move the file aside to start without its jobs)"
                        : "")
                << "\n";
      return kExitFailure;
    }
    state_file = *std::move(opened);
    saved = *std::move(loaded);
    // A first start writes an empty file: an unwritable path fails now, not
    // at the first job.
    if (!saved.has_value()) {
      if (absl::Status s = state_file->Save(conveyor::v1::CoordinatorState());
          !s.ok()) {
        std::cerr << "conveyor-coordinator: --state-file: " << s.message()
                  << "\n";
        return kExitFailure;
      }
    }
  }

  auto metrics = std::make_shared<conveyor::coordinator::CoordinatorMetrics>();
  conveyor::coordinator::JobManagerOptions manager_options;
  manager_options.heartbeat_timeout = Millis(flags.heartbeat_timeout);
  manager_options.recv_timeout = Millis(flags.recv_timeout);
  manager_options.observer = metrics.get();
  manager_options.state_file = state_file.get();
  manager_options.version = conveyor::kVersion;
  manager_options.owner_quotas = *std::move(quotas);
  manager_options.aging_per_minute = flags.aging_per_minute;
  manager_options.preemption = !flags.no_preemption;
  if (flags.fault_commit_step > 0) {
    SPDLOG_WARN("fault injection: pausing {} ms before the manifest of step {}",
                flags.fault_commit_delay_ms, flags.fault_commit_step);
    manager_options.TEST_fault_commit_step = flags.fault_commit_step;
    manager_options.TEST_fault_commit_delay =
        std::chrono::milliseconds(flags.fault_commit_delay_ms);
  }
  conveyor::coordinator::JobManager manager(std::move(manager_options));
  metrics->Attach(&manager);
  if (saved.has_value()) {
    if (absl::Status s = manager.Restore(*saved); !s.ok()) {
      std::cerr << "conveyor-coordinator: --state-file " << flags.state_file
                << ": " << s.message()
                << " (move the file aside to start without its jobs)\n";
      return kExitFailure;
    }
    if (absl::Status s = manager.Persist(); !s.ok()) {
      std::cerr << "conveyor-coordinator: --state-file " << flags.state_file
                << ": cannot write the restored records: " << s.message()
                << "\n";
      return kExitFailure;
    }
  }
  std::string auth_token;
  if (!flags.auth_token_file.empty()) {
    absl::StatusOr<std::string> token =
        conveyor::ReadAuthTokenFile(flags.auth_token_file);
    if (!token.ok()) {
      std::cerr << "conveyor-coordinator: --auth-token-file: "
                << token.status().message() << "\n";
      return conveyor::kExitUsage;
    }
    auth_token = *std::move(token);
    if (const std::string warning =
            conveyor::AuthTokenFileWarning(flags.auth_token_file);
        !warning.empty()) {
      SPDLOG_WARN("{}", warning);
    }
  }
  conveyor::proto::TlsFilesReport tls_report;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      conveyor::proto::MakeServerCredentials(flags.tls, &tls_report);
  if (!credentials.ok()) {
    std::cerr << "conveyor-coordinator: " << credentials.status().message()
              << "\n";
    return credentials.status().code() == absl::StatusCode::kInvalidArgument
               ? conveyor::kExitUsage
               : kExitFailure;
  }
  for (const std::string& warning : tls_report.warnings) {
    SPDLOG_WARN("{}", warning);
  }
  for (const conveyor::proto::CertificateValidity& c :
       tls_report.certificates) {
    conveyor::telemetry::AddCertificateExpiry(
        *metrics->registry(), c.flag, c.path, c.subject, c.not_after_unix);
  }
  conveyor::coordinator::CoordinatorService coordinator_service(&manager,
                                                                auth_token);
  conveyor::coordinator::WorkerSessionService session_service(&manager,
                                                              auth_token);
  session_service.set_message_timer(
      [&metrics](conveyor::v1::WorkerMessage::KindCase kind,
                 std::chrono::steady_clock::duration took) {
        metrics->ObserveWorkerMessage(
            kind, std::chrono::duration<double>(took).count());
      });

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(flags.listen, *credentials, &port);
  // gRPC sets SO_REUSEPORT by default: a second coordinator on the same
  // port would then start too, and the kernel would split calls between
  // the two. Off, the second fails to bind and exits.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(conveyor::proto::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(conveyor::proto::kMaxMessageBytes);
  builder.RegisterService(&coordinator_service);
  builder.RegisterService(&session_service);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(metrics->InterceptorFactory());
  interceptors.push_back(
      conveyor::proto::AnsweredByInterceptorFactory("coordinator"));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "conveyor-coordinator: cannot listen on " << flags.listen
              << " (address in use or invalid)\n";
    return kExitFailure;
  }
  // The address clients should dial: the given host with the bound port.
  std::string address = flags.listen;
  if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    address = absl::StrCat(address.substr(0, colon + 1), port);
  }
  SPDLOG_INFO(
      "conveyor-coordinator {} listening on {} (heartbeat timeout {} s)",
      conveyor::kVersion, address, flags.heartbeat_timeout);
  // Read by /readyz: declared before the server, so it outlives it.
  std::atomic<bool> shutting_down{false};
  std::unique_ptr<conveyor::telemetry::MetricsServer> metrics_server;
  std::string ready = absl::StrCat(address, "\n");
  // The server holds collectables weakly: this one must outlive it.
  auto process = std::make_shared<conveyor::telemetry::ProcessCollector>();
  if (!flags.metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<conveyor::telemetry::MetricsServer>>
        started = conveyor::telemetry::MetricsServer::Start(
            flags.metrics_address, {metrics->registry(), metrics, process},
            [&]() -> conveyor::telemetry::Readiness {
              if (shutting_down.load()) return {false, "shutting down"};
              // Ready whether or not workers have registered: a readiness
              // probe that waited for them would hide the coordinator from
              // the very workers that must reach it to register.
              return {true, conveyor::coordinator::FleetSummary(
                                manager.ListWorkers(), manager.ListJobs())};
            });
    if (!started.ok()) {
      std::cerr << "conveyor-coordinator: --metrics-address: "
                << started.status().message() << "\n";
      server->Shutdown();
      return kExitFailure;
    }
    metrics_server = *std::move(started);
    SPDLOG_INFO("serving metrics on http://{}/metrics",
                metrics_server->address());
    // The ready file's second line, so tools that start the daemon with
    // port 0 learn where to scrape.
    absl::StrAppend(&ready, "metrics ", metrics_server->address(), "\n");
  }
  if (!flags.ready_file.empty()) {
    absl::Status s = conveyor::WriteFileAtomically(flags.ready_file, ready);
    if (!s.ok()) {
      std::cerr << "conveyor-coordinator: --ready-file: " << s.message()
                << "\n";
      server->Shutdown();
      return kExitFailure;
    }
  }

  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    while (!stop.load()) {
      manager.Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  int signal = 0;
  sigwait(&signals, &signal);
  SPDLOG_INFO("signal {}: shutting down", signal);
  shutting_down.store(true);
  stop.store(true);
  ticker.join();
  manager.Shutdown();
  // Open streams (workers, watchers) are cancelled after a short grace.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  // Before the manager goes: /readyz and the collector read it.
  metrics_server.reset();
  SPDLOG_INFO("stopped");
  return 0;
}
