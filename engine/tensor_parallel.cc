#include "engine/tensor_parallel.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "engine/backend.h"

namespace conveyor::engine {
namespace {

// Each collective is: every rank publishes its tensor into its own host slot,
// a barrier, every rank reads what it needs of all slots, a second barrier
// (so that no rank overwrites its slot for the next collective while another
// still reads it), and every rank writes its result. A rank writes only its
// own slot, and only between the second barrier of one collective and the
// first of the next; the barriers' mutex orders those writes before the
// reads.
class HostTensorParallelGroup final : public TensorParallelGroup {
 public:
  explicit HostTensorParallelGroup(int size) : size_(size), slots_(size) {}

  int size() const override { return size_; }

  absl::Status AllReduceSum(int rank, const Tensor& x,
                            const Tensor& out) override {
    RETURN_IF_ERROR(Check(rank, x, "all-reduce", /*f32_only=*/true));
    if (out.shape() != x.shape() || out.dtype() != x.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor-parallel all-reduce: output ", ShapeString(out.shape()),
          " for input ", ShapeString(x.shape())));
    }
    if (size_ == 1) return CopyInto(x, out);
    RETURN_IF_ERROR(Publish(rank, x));
    RETURN_IF_ERROR(Arrive());
    RETURN_IF_ERROR(SameSizes("all-reduce"));
    std::vector<float> sum = Sum(0, static_cast<size_t>(x.numel()));
    RETURN_IF_ERROR(Arrive());
    return out.backend()->CopyFromHost(sum.data(), out.bytes(), out);
  }

  absl::Status ReduceScatterRows(int rank, const Tensor& x,
                                 const Tensor& out) override {
    RETURN_IF_ERROR(Check(rank, x, "reduce-scatter", /*f32_only=*/true));
    if (x.rank() < 1 || x.dim(0) % size_ != 0 || out.dtype() != x.dtype() ||
        out.numel() * size_ != x.numel() || out.dim(0) * size_ != x.dim(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor-parallel reduce-scatter: ", ShapeString(x.shape()),
          " does not split into ", size_, " blocks of rows shaped ",
          ShapeString(out.shape())));
    }
    if (size_ == 1) return CopyInto(x, out);
    RETURN_IF_ERROR(Publish(rank, x));
    RETURN_IF_ERROR(Arrive());
    RETURN_IF_ERROR(SameSizes("reduce-scatter"));
    const size_t block = static_cast<size_t>(out.numel());
    std::vector<float> sum = Sum(block * rank, block);
    RETURN_IF_ERROR(Arrive());
    return out.backend()->CopyFromHost(sum.data(), out.bytes(), out);
  }

  absl::Status AllGatherRows(int rank, const Tensor& x,
                             const Tensor& out) override {
    RETURN_IF_ERROR(Check(rank, x, "all-gather", /*f32_only=*/false));
    if (x.rank() < 1 || out.dtype() != x.dtype() ||
        out.numel() != x.numel() * size_ || out.dim(0) != x.dim(0) * size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor-parallel all-gather: ", size_, " blocks shaped ",
          ShapeString(x.shape()), " do not make ", ShapeString(out.shape())));
    }
    if (size_ == 1) return CopyInto(x, out);
    RETURN_IF_ERROR(Publish(rank, x));
    RETURN_IF_ERROR(Arrive());
    RETURN_IF_ERROR(SameSizes("all-gather"));
    std::vector<char> all;
    all.reserve(out.bytes());
    for (const std::vector<char>& slot : slots_) {
      all.insert(all.end(), slot.begin(), slot.end());
    }
    RETURN_IF_ERROR(Arrive());
    return out.backend()->CopyFromHost(all.data(), all.size(), out);
  }

  void Abort(const absl::Status& why) override {
    MutexLock lock(mu_);
    if (!aborted_.ok()) return;
    aborted_ = why.ok() ? absl::AbortedError(
                              "a tensor-parallel rank stopped before the "
                              "collective")
                        : why;
    changed_.NotifyAll();
  }

  void Reset() override {
    MutexLock lock(mu_);
    aborted_ = absl::OkStatus();
    arrived_ = 0;
  }

 private:
  absl::Status Check(int rank, const Tensor& x, const char* op,
                     bool f32_only) const {
    if (rank < 0 || rank >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor-parallel ", op, ": rank ", rank,
                       " outside a group of ", size_));
    }
    if (!x.defined() || (f32_only && x.dtype() != DType::kF32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor-parallel ", op, ": the input is ",
                       x.defined() ? DTypeName(x.dtype()) : "undefined",
                       f32_only ? "; only f32 is summed" : ""));
    }
    return absl::OkStatus();
  }

  static absl::Status CopyInto(const Tensor& x, const Tensor& out) {
    if (x.raw() == out.raw() && x.backend() == out.backend()) {
      return absl::OkStatus();
    }
    if (x.backend() == out.backend()) {
      x.backend()->Copy(x, out);
      return absl::OkStatus();
    }
    std::vector<char> host(x.bytes());
    RETURN_IF_ERROR(x.backend()->CopyToHost(x, host.data(), host.size()));
    return out.backend()->CopyFromHost(host.data(), host.size(), out);
  }

  absl::Status Publish(int rank, const Tensor& x) {
    std::vector<char>& slot = slots_[rank];
    slot.resize(x.bytes());
    if (slot.empty()) return absl::OkStatus();
    return x.backend()->CopyToHost(x, slot.data(), slot.size());
  }

  // The ranks called one collective with tensors of different sizes: a bug
  // in a layer's shard, reported by every rank alike.
  absl::Status SameSizes(const char* op) const {
    for (int r = 1; r < size_; ++r) {
      if (slots_[r].size() != slots_[0].size()) {
        return absl::InternalError(absl::StrCat(
            "tensor-parallel ", op, ": rank ", r, " gave ", slots_[r].size(),
            " bytes but rank 0 ", slots_[0].size()));
      }
    }
    return absl::OkStatus();
  }

  // Elements [begin, begin + n) of the slots' sum, added in rank order.
  std::vector<float> Sum(size_t begin, size_t n) const {
    std::vector<float> sum(n);
    if (n == 0) return sum;
    std::memcpy(sum.data(),
                reinterpret_cast<const float*>(slots_[0].data()) + begin,
                n * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      const float* part =
          reinterpret_cast<const float*>(slots_[r].data()) + begin;
      for (size_t i = 0; i < n; ++i) sum[i] += part[i];
    }
    return sum;
  }

  // Blocks until every rank has arrived (OK) or the group is aborted.
  absl::Status Arrive() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    if (!aborted_.ok()) return aborted_;
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      changed_.NotifyAll();
      return absl::OkStatus();
    }
    changed_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return generation_ != generation || !aborted_.ok();
    });
    return generation_ != generation ? absl::OkStatus() : aborted_;
  }

  const int size_;
  // By rank; see the class comment for who touches them when.
  std::vector<std::vector<char>> slots_;
  Mutex mu_;
  CondVar changed_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<TensorParallelGroup>>
CreateHostTensorParallelGroup(int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a tensor-parallel group needs at least one rank, not ", size));
  }
  return std::unique_ptr<TensorParallelGroup>(
      new HostTensorParallelGroup(size));
}

}  // namespace conveyor::engine
