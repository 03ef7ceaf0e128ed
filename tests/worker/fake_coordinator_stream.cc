#include "tests/worker/fake_coordinator_stream.h"

#include <utility>

namespace conveyor::worker {
namespace {

// What Open hands the session: its own object to destroy, while the test
// keeps the stream it forwards to.
class SharedStream final : public CoordinatorStreamInterface {
 public:
  explicit SharedStream(std::shared_ptr<FakeCoordinatorStream> stream)
      : stream_(std::move(stream)) {}

  bool Read(v1::CoordinatorMessage* message) override {
    return stream_->Read(message);
  }
  bool Write(const v1::WorkerMessage& message) override {
    return stream_->Write(message);
  }
  void WritesDone() override { stream_->WritesDone(); }
  absl::Status Finish() override { return stream_->Finish(); }
  void Cancel() override { stream_->Cancel(); }

 private:
  const std::shared_ptr<FakeCoordinatorStream> stream_;
};

}  // namespace

bool FakeCoordinatorStream::Read(v1::CoordinatorMessage* message) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !to_read_.empty() || end_.has_value();
  };
  // Blocks as long as the coordinator says nothing, as a real Read does.
  mu_.Await(absl::Condition(&ready));
  if (to_read_.empty()) return false;
  *message = std::move(to_read_.front());
  to_read_.pop_front();
  return true;
}

bool FakeCoordinatorStream::Write(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&mu_);
  if (end_.has_value() || writes_done_) return false;
  written_.push_back(message);
  return true;
}

void FakeCoordinatorStream::WritesDone() {
  absl::MutexLock lock(&mu_);
  writes_done_ = true;
}

absl::Status FakeCoordinatorStream::Finish() {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  return end_.value_or(absl::OkStatus());
}

void FakeCoordinatorStream::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (end_.has_value()) return;
  // What gRPC's Finish says after ClientContext::TryCancel.
  end_ = absl::CancelledError("Cancelled");
  // A cancelled call delivers nothing more.
  to_read_.clear();
}

void FakeCoordinatorStream::Push(v1::CoordinatorMessage message) {
  absl::MutexLock lock(&mu_);
  if (end_.has_value()) return;
  to_read_.push_back(std::move(message));
}

void FakeCoordinatorStream::End(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (end_.has_value()) return;
  end_ = std::move(status);
}

std::optional<v1::WorkerMessage> FakeCoordinatorStream::NextWritten(
    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return handed_out_ < written_.size();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return std::nullopt;
  }
  return written_[handed_out_++];
}

std::optional<v1::WorkerMessage> FakeCoordinatorStream::NextWrittenOfKind(
    v1::WorkerMessage::KindCase kind, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::optional<v1::WorkerMessage> m = NextWritten(deadline - absl::Now());
    if (!m.has_value() || m->kind_case() == kind) return m;
  }
}

std::vector<v1::WorkerMessage> FakeCoordinatorStream::written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

bool FakeCoordinatorStream::WaitForWritesDone(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&writes_done_), timeout);
}

bool FakeCoordinatorStream::WaitForCancel(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&cancelled_), timeout);
}

bool FakeCoordinatorStream::WaitForFinish(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout);
}

bool FakeCoordinatorStream::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

std::unique_ptr<CoordinatorStreamInterface> FakeCoordinatorDialer::Open() {
  auto stream = std::make_shared<FakeCoordinatorStream>();
  {
    absl::MutexLock lock(&mu_);
    streams_.push_back(stream);
  }
  return std::make_unique<SharedStream>(std::move(stream));
}

std::shared_ptr<FakeCoordinatorStream> FakeCoordinatorDialer::WaitForOpen(
    int n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto opened = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(streams_.size()) > n;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&opened), timeout)) return nullptr;
  return streams_[n];
}

int FakeCoordinatorDialer::opens() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

}  // namespace conveyor::worker
