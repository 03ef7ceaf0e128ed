// CoordinatorClient: conveyorctl's connection to the Coordinator service of
// conveyor-coordinator (proto/conveyor/v1/conveyor.proto). A thin layer over
// the generated stub: each unary call gets a deadline, results are
// absl::Status (codes as the coordinator sent them, so INVALID_ARGUMENT keeps
// its "file:line:col: ..." message), and a failure to reach the coordinator
// names its address.
//
// Thread-safe: calls may come from several threads; CancelWatches() is meant
// to be called from another thread (run's signal handling) while WatchJob()
// blocks.
#ifndef CONVEYOR_CLI_COORDINATOR_CLIENT_H_
#define CONVEYOR_CLI_COORDINATOR_CLIENT_H_

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "conveyor/v1/conveyor.grpc.pb.h"
#include "grpcpp/security/credentials.h"
#include "proto/grpc_diagnostics.h"

namespace conveyor::cli {

inline constexpr char kCoordinatorEnv[] = "CONVEYOR_COORDINATOR";
inline constexpr char kDefaultCoordinatorAddress[] = "127.0.0.1:7070";
// Where --auth-token-file defaults from.
inline constexpr char kAuthTokenFileEnv[] = "CONVEYOR_AUTH_TOKEN_FILE";

// `flag` if non-empty, else $CONVEYOR_COORDINATOR if set and non-empty, else
// kDefaultCoordinatorAddress.
std::string ResolveCoordinatorAddress(absl::string_view flag);

class CoordinatorClient {
 public:
  // Does not connect: gRPC connects on the first call, so an unreachable
  // coordinator shows up there as Unavailable. InvalidArgument for an empty
  // address or a non-positive timeout. A non-empty `auth_token` is presented
  // on every call (common/auth_token.h); a coordinator that wants another
  // answers Unauthenticated. `credentials`: TLS (proto/credentials.h); null:
  // plaintext.
  // `tls` says which TLS files the credentials came from, to name the
  // likely cause of a refused handshake.
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Create(
      std::string address, absl::Duration rpc_timeout,
      std::string auth_token = "",
      std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
      proto::ClientTls tls = {});

  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  // Each unary call returns the coordinator's status, except that
  // Unavailable and DeadlineExceeded say which address did not answer.
  // SubmitJob: InvalidArgument for a bad job (message "file:line:col: ..."),
  // ResourceExhausted when the cluster has fewer workers than the job needs.
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& request);
  // NotFound for an unknown id.
  absl::StatusOr<v1::Job> GetJob(const std::string& id);
  // The jobs, and a warning while the coordinator is unhealthy.
  absl::StatusOr<v1::ListJobsResponse> ListJobs();
  // NotFound for an unknown id. A job that already ended is returned as is.
  absl::StatusOr<v1::Job> CancelJob(const std::string& id);
  absl::StatusOr<std::vector<v1::Worker>> ListWorkers();
  // NotFound for an unknown or lost worker (id or name); the worker as the
  // drain left it (draining).
  absl::StatusOr<v1::Worker> DrainWorker(const std::string& worker,
                                         const std::string& reason);
  // Step `step` of job `id` (0: the newest complete step), every rank's
  // timeline. NotFound for an unknown job or a step no longer kept.
  absl::StatusOr<v1::Trace> GetTrace(const std::string& id, int64_t step);

  // Streams WatchJob(id), calling `on_event` for each event, until the
  // coordinator ends the stream (after the job's final state). No deadline:
  // a job runs as long as it runs. Returns the stream's status: OK when the
  // coordinator closed it normally, NotFound for an unknown id, Unavailable
  // when the connection broke, Cancelled after CancelWatches().
  absl::Status WatchJob(
      const std::string& id,
      const std::function<void(const v1::JobEvent&)>& on_event)
      ABSL_LOCKS_EXCLUDED(mutex_);

  // Cancels every WatchJob in progress and makes later ones return
  // Cancelled at once.
  void CancelWatches() ABSL_LOCKS_EXCLUDED(mutex_);

  const std::string& address() const { return address_; }

 private:
  CoordinatorClient(std::string address, absl::Duration rpc_timeout,
                    std::string auth_token,
                    std::unique_ptr<v1::Coordinator::Stub> stub,
                    proto::ClientTls tls)
      : address_(std::move(address)),
        rpc_timeout_(rpc_timeout),
        auth_token_(std::move(auth_token)),
        stub_(std::move(stub)),
        tls_(tls) {}

  // The token, when there is one, and (unary calls) the deadline.
  void Authenticate(grpc::ClientContext& context) const;
  void SetDeadline(grpc::ClientContext& context) const;
  absl::Status FromGrpc(const grpc::Status& status,
                        const grpc::ClientContext& context) const;

  const std::string address_;
  const absl::Duration rpc_timeout_;
  const std::string auth_token_;
  const std::unique_ptr<v1::Coordinator::Stub> stub_;
  const proto::ClientTls tls_;

  absl::Mutex mutex_;
  std::set<grpc::ClientContext*> watches_ ABSL_GUARDED_BY(mutex_);
  bool watches_cancelled_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_COORDINATOR_CLIENT_H_
