#include "engine/mesh_collective.h"

#include <cstddef>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::engine {
namespace {

std::string Describe(const Tensor& t) {
  return absl::StrCat(DTypeName(t.dtype()), " ", ShapeString(t.shape()));
}

// Host-staged: every transfer goes through a host vector, so any pair of
// backends works (CPU and CUDA alike) and several devices may share one
// backend. Backend::CopyToHost waits for the source's queued work, and
// CopyFromHost from pageable memory lets the caller reuse the source at once,
// which gives the ordering promised in the header.
class HostMeshCollective final : public MeshCollective {
 public:
  explicit HostMeshCollective(std::vector<Backend*> backends)
      : backends_(std::move(backends)) {}

  int size() const override { return static_cast<int>(backends_.size()); }
  Backend* backend(int device) const override {
    CONVEYOR_CHECK(device >= 0 && device < size(), "no such mesh device");
    return backends_[device];
  }

  absl::Status Copy(const Tensor& src, const Tensor& dst) override {
    if (!src.defined() || !dst.defined()) {
      return absl::InvalidArgumentError(
          "mesh copy: source or destination is undefined");
    }
    if (src.shape() != dst.shape() || src.dtype() != dst.dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh copy: source ", Describe(src),
                       " into destination ", Describe(dst)));
    }
    if (src.bytes() == 0) return absl::OkStatus();
    if (src.backend() == dst.backend()) {
      // One backend (a CPU mesh, or a device's own tensor): no staging, and
      // the backend's own queue orders the copy.
      src.backend()->Copy(src, dst);
      return absl::OkStatus();
    }
    std::vector<char> host(src.bytes());
    RETURN_IF_ERROR(src.backend()->CopyToHost(src, host.data(), host.size()));
    return dst.backend()->CopyFromHost(host.data(), host.size(), dst);
  }

  absl::Status ReduceSumToFirst(
      const std::vector<std::vector<Tensor>>& per_tensor) override {
    RETURN_IF_ERROR(Check(per_tensor, "reduce", /*f32_only=*/true));
    std::vector<float> sum, part;
    for (const std::vector<Tensor>& group : per_tensor) {
      const size_t n = static_cast<size_t>(group[0].numel());
      if (n == 0) continue;
      sum.resize(n);
      part.resize(n);
      RETURN_IF_ERROR(group[0].backend()->CopyToHost(group[0], sum.data(),
                                                     n * sizeof(float)));
      // In device order, so the result does not depend on timing, and the
      // NCCL implementation can be compared against it.
      for (size_t d = 1; d < group.size(); ++d) {
        RETURN_IF_ERROR(group[d].backend()->CopyToHost(group[d], part.data(),
                                                       n * sizeof(float)));
        for (size_t i = 0; i < n; ++i) sum[i] += part[i];
      }
      RETURN_IF_ERROR(group[0].backend()->CopyFromHost(
          sum.data(), n * sizeof(float), group[0]));
    }
    return absl::OkStatus();
  }

  absl::Status BroadcastFromFirst(
      const std::vector<std::vector<Tensor>>& per_tensor) override {
    RETURN_IF_ERROR(Check(per_tensor, "broadcast", /*f32_only=*/false));
    std::vector<char> host;
    for (const std::vector<Tensor>& group : per_tensor) {
      const Tensor& first = group[0];
      if (first.bytes() == 0) continue;
      host.resize(first.bytes());
      RETURN_IF_ERROR(
          first.backend()->CopyToHost(first, host.data(), host.size()));
      for (size_t d = 1; d < group.size(); ++d) {
        RETURN_IF_ERROR(group[d].backend()->CopyFromHost(
            host.data(), host.size(), group[d]));
      }
    }
    return absl::OkStatus();
  }

 private:
  // Everything is checked before anything is written, so a bad call leaves
  // every tensor as it was.
  absl::Status Check(const std::vector<std::vector<Tensor>>& per_tensor,
                     const char* op, bool f32_only) const {
    for (size_t i = 0; i < per_tensor.size(); ++i) {
      const std::vector<Tensor>& group = per_tensor[i];
      if (static_cast<int>(group.size()) != size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("mesh ", op, ": tensor ", i, " has ", group.size(),
                         " copies for a mesh of ", size(), " devices"));
      }
      for (size_t d = 0; d < group.size(); ++d) {
        if (!group[d].defined()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mesh ", op, ": tensor ", i, " on device ", d, " is undefined"));
        }
        if (group[d].shape() != group[0].shape() ||
            group[d].dtype() != group[0].dtype()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mesh ", op, ": tensor ", i, " is ", Describe(group[d]),
              " on device ", d, " but ", Describe(group[0]), " on device 0"));
        }
      }
      if (f32_only && group[0].dtype() != DType::kF32) {
        return absl::InvalidArgumentError(
            absl::StrCat("mesh ", op, ": tensor ", i, " is ",
                         Describe(group[0]), "; only f32 is summed"));
      }
    }
    return absl::OkStatus();
  }

  std::vector<Backend*> backends_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MeshCollective>> CreateHostMeshCollective(
    std::vector<Backend*> backends) {
  if (backends.empty()) {
    return absl::InvalidArgumentError("a mesh needs at least one device");
  }
  for (size_t d = 0; d < backends.size(); ++d) {
    if (backends[d] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh device ", d, " has no backend"));
    }
  }
  return std::unique_ptr<MeshCollective>(
      new HostMeshCollective(std::move(backends)));
}

}  // namespace conveyor::engine
