// A stand-in for conveyor-coordinator with the same command line, for
// testing `conveyorctl run` before (and independently of) the real daemon:
// serves FakeCoordinator on --listen and writes the bound address to
// --ready-file the way the real one must (atomically, "host:port\n").
//
// Knobs (environment): CONVEYOR_FAKE_STEP_DELAY_MS (default 20),
// CONVEYOR_FAKE_OUTCOME (SUCCEEDED or FAILED), CONVEYOR_FAKE_COORDINATOR_EXIT
// (exit with status 3 at once, to test startup failures).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "tests/cli/fake_coordinator.h"

int main(int argc, char** argv) {
  std::string listen, ready_file;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--listen") listen = argv[i + 1];
    if (flag == "--ready-file") ready_file = argv[i + 1];
  }
  std::cout << "fake conveyor-coordinator: listen " << listen << ", ready file "
            << ready_file << std::endl;
  if (std::getenv("CONVEYOR_FAKE_COORDINATOR_EXIT") != nullptr) {
    std::cerr << "fake conveyor-coordinator: exiting as asked" << std::endl;
    return 3;
  }
  if (listen.empty() || ready_file.empty()) {
    std::cerr << "usage: --listen ADDR --ready-file PATH" << std::endl;
    return 2;
  }
  conveyor::cli::testing::FakeCoordinator::Options options;
  options.step_delay = absl::Milliseconds(20);
  if (const char* ms = std::getenv("CONVEYOR_FAKE_STEP_DELAY_MS")) {
    int value = 0;
    if (absl::SimpleAtoi(ms, &value)) {
      options.step_delay = absl::Milliseconds(value);
    }
  }
  if (const char* outcome = std::getenv("CONVEYOR_FAKE_OUTCOME");
      outcome != nullptr && std::string(outcome) == "FAILED") {
    options.outcome = conveyor::v1::FAILED;
    options.fail_after_step = 3;
  }

  // Block the stop signals before gRPC starts its threads, then wait for
  // one here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  conveyor::cli::testing::FakeCoordinator service(options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(
      static_cast<conveyor::v1::Coordinator::Service*>(&service));
  builder.RegisterService(
      static_cast<conveyor::v1::WorkerSession::Service*>(&service));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "fake conveyor-coordinator: cannot listen on " << listen
              << std::endl;
    return 1;
  }
  const std::string host = listen.substr(0, listen.rfind(':'));
  const std::string tmp = absl::StrCat(ready_file, ".tmp");
  {
    std::ofstream out(tmp);
    out << host << ":" << port << "\n";
  }
  std::rename(tmp.c_str(), ready_file.c_str());
  std::cout << "fake conveyor-coordinator: serving on " << host << ":" << port
            << std::endl;

  int sig = 0;
  sigwait(&stop, &sig);
  std::cout << "fake conveyor-coordinator: signal " << sig << ", stopping"
            << std::endl;
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}
