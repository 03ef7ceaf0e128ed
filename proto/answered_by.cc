#include "proto/answered_by.h"

#include <utility>

#include "grpcpp/support/interceptor.h"

namespace conveyor::proto {
namespace {

class AnsweredByInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit AnsweredByInterceptor(const std::string* server) : server_(server) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      methods->GetSendTrailingMetadata()->emplace(kAnsweredByKey, *server_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const server_;  // the factory's, which outlives calls
};

class AnsweredByFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit AnsweredByFactory(std::string server) : server_(std::move(server)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo*) override {
    return new AnsweredByInterceptor(&server_);
  }

 private:
  const std::string server_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
AnsweredByInterceptorFactory(std::string server) {
  return std::make_unique<AnsweredByFactory>(std::move(server));
}

std::string AnsweredBy(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  const auto it = trailers.find(kAnsweredByKey);
  if (it == trailers.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace conveyor::proto
