// FakeCoordinatorDialer and FakeCoordinatorStream: the coordinator's end of
// the worker's stream (worker/coordinator_stream.h), in process, for tests
// of WorkerSession that need no sockets and run the same way every time.
//
// Each Open makes a FakeCoordinatorStream, which the test takes from the
// dialer (WaitForOpen) to play the coordinator: Push queues a
// CoordinatorMessage for the worker's Read, NextWritten hands out what the
// worker wrote, in order, and End ends the stream with a status (what
// Finish then returns). A stream nobody pushes to or ends is a coordinator
// that never answers; Cancel ends it with CANCELLED, as gRPC does.
//
// Thread-safety: every method may be called from any thread. The waits
// give up after a generous bound, so a broken test fails rather than hangs.
#ifndef CONVEYOR_TESTS_WORKER_FAKE_COORDINATOR_STREAM_H_
#define CONVEYOR_TESTS_WORKER_FAKE_COORDINATOR_STREAM_H_

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "conveyor/v1/conveyor.pb.h"
#include "worker/coordinator_stream.h"

namespace conveyor::worker {

inline constexpr absl::Duration kFakeStreamWait = absl::Seconds(30);

class FakeCoordinatorStream final : public CoordinatorStreamInterface {
 public:
  // The worker's side (CoordinatorStreamInterface).
  bool Read(v1::CoordinatorMessage* message) override ABSL_LOCKS_EXCLUDED(mu_);
  bool Write(const v1::WorkerMessage& message) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void WritesDone() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Finish() override ABSL_LOCKS_EXCLUDED(mu_);
  void Cancel() override ABSL_LOCKS_EXCLUDED(mu_);

  // The coordinator's side.
  // Queues `message` for the worker's Read; ignored once the stream ended.
  void Push(v1::CoordinatorMessage message) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the stream with `status`: Read returns the messages queued before,
  // then false, and Finish returns `status`; later Writes fail. Ignored
  // once the stream ended.
  void End(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // The worker's next message not handed out yet, in the order written;
  // nullopt if none comes within `timeout`.
  std::optional<v1::WorkerMessage> NextWritten(
      absl::Duration timeout = kFakeStreamWait) ABSL_LOCKS_EXCLUDED(mu_);
  // Like NextWritten, skipping (and handing out) messages of other kinds.
  std::optional<v1::WorkerMessage> NextWrittenOfKind(
      v1::WorkerMessage::KindCase kind,
      absl::Duration timeout = kFakeStreamWait) ABSL_LOCKS_EXCLUDED(mu_);
  // Every message the worker wrote, handed out or not.
  std::vector<v1::WorkerMessage> written() const ABSL_LOCKS_EXCLUDED(mu_);
  // Wait until the worker has half-closed the stream (WritesDone),
  // cancelled it, or called Finish (it is done with the stream); false if
  // that does not happen within `timeout`.
  bool WaitForWritesDone(absl::Duration timeout = kFakeStreamWait)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool WaitForCancel(absl::Duration timeout = kFakeStreamWait)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool WaitForFinish(absl::Duration timeout = kFakeStreamWait)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> to_read_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::WorkerMessage> written_ ABSL_GUARDED_BY(mu_);
  size_t handed_out_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);
  bool writes_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class FakeCoordinatorDialer final : public CoordinatorDialerInterface {
 public:
  // A new FakeCoordinatorStream, kept for the test (WaitForOpen).
  std::unique_ptr<CoordinatorStreamInterface> Open() override
      ABSL_LOCKS_EXCLUDED(mu_);

  // The stream of the `n`-th Open (0-based), once it has happened; null if
  // it does not within `timeout`.
  std::shared_ptr<FakeCoordinatorStream> WaitForOpen(
      int n, absl::Duration timeout = kFakeStreamWait) ABSL_LOCKS_EXCLUDED(mu_);
  // How many streams were opened.
  int opens() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<FakeCoordinatorStream>> streams_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_TESTS_WORKER_FAKE_COORDINATOR_STREAM_H_
