// A stand-in for conveyor-worker with the same command line, for testing
// `conveyorctl run`: registers with the (fake) coordinator through the
// WorkerSession stream and holds the stream open until it is stopped.
//
// Knob (environment): CONVEYOR_FAKE_WORKER_EXIT (exit with status 3 at
// once, to test a worker that dies during startup).
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "conveyor/v1/conveyor.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/protocol.h"

int main(int argc, char** argv) {
  std::string coordinator, name, data_address;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--coordinator") coordinator = argv[i + 1];
    if (flag == "--name") name = argv[i + 1];
    if (flag == "--data-address") data_address = argv[i + 1];
  }
  std::cout << "fake conveyor-worker " << name << ": coordinator "
            << coordinator << std::endl;
  if (std::getenv("CONVEYOR_FAKE_WORKER_EXIT") != nullptr) {
    std::cerr << "fake conveyor-worker: exiting as asked" << std::endl;
    return 3;
  }
  auto stub = conveyor::v1::WorkerSession::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->Session(&context);
  conveyor::v1::WorkerMessage hello;
  hello.mutable_register_()->set_protocol_version(
      conveyor::proto::kProtocolVersion);
  hello.mutable_register_()->set_name(name);
  hello.mutable_register_()->set_data_address(data_address);
  hello.mutable_register_()->add_devices("cpu:1");
  if (!stream->Write(hello)) {
    std::cerr << "fake conveyor-worker: cannot register" << std::endl;
    return 1;
  }
  conveyor::v1::CoordinatorMessage message;
  while (stream->Read(&message)) {
    if (message.has_registered()) {
      std::cout << "fake conveyor-worker: registered as "
                << message.registered().worker_id() << std::endl;
    }
  }
  const grpc::Status status = stream->Finish();
  std::cout << "fake conveyor-worker: session ended: " << status.error_message()
            << std::endl;
  return 0;
}
