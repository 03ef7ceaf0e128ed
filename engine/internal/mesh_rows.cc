#include "engine/internal/mesh_rows.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::engine {

absl::StatusOr<std::vector<Tensor>> SplitRows(MeshCollective& collective,
                                              const std::vector<int>& devices,
                                              const Tensor& x, int stage,
                                              int microbatch,
                                              const char* what) {
  const int n = static_cast<int>(devices.size());
  if (!x.defined() || x.rank() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, ": the ", what, " of microbatch ",
                     microbatch, " has no rows to split over the mesh"));
  }
  const int64_t rows = x.dim(0);
  if (rows % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", stage, ": the ", what, " of microbatch ", microbatch, " has ",
        rows, " rows, which do not split evenly over ", n,
        " replicas of the stage (make the microbatch size a multiple of ", n,
        ")"));
  }
  const int64_t per = rows / n;
  std::vector<Tensor> parts;
  parts.reserve(n);
  for (int i = 0; i < n; ++i) {
    Tensor part = n == 1 ? x : x.Rows(i * per, (i + 1) * per);
    Backend* backend = collective.backend(devices[i]);
    if (part.backend() != backend) {
      // On another device (or the host): the replica computes on its own.
      ASSIGN_OR_RETURN(Tensor local, backend->Empty(part.shape(), x.dtype()));
      RETURN_IF_ERROR(collective.Copy(part, local));
      part = std::move(local);
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

absl::StatusOr<Tensor> ConcatRows(MeshCollective& collective,
                                  const std::vector<Tensor>& parts, int stage) {
  const Tensor& first = parts[0];
  if (parts.size() == 1) return first;  // One replica: nothing to copy.
  Shape shape = first.shape();
  int64_t rows = 0;
  for (size_t d = 0; d < parts.size(); ++d) {
    const Tensor& p = parts[d];
    // Replicas of one stage on equal shards give equal shapes; anything else
    // is a bug in a layer.
    if (p.rank() != first.rank() || p.rank() < 1 ||
        p.dtype() != first.dtype() ||
        !std::equal(p.shape().begin() + 1, p.shape().end(),
                    first.shape().begin() + 1)) {
      return absl::InternalError(absl::StrCat(
          "stage ", stage, ": replica ", d, " gave ", ShapeString(p.shape()),
          " but replica 0 ", ShapeString(first.shape())));
    }
    rows += p.dim(0);
  }
  shape[0] = rows;
  ASSIGN_OR_RETURN(Tensor out,
                   collective.backend(0)->Empty(shape, first.dtype()));
  int64_t begin = 0;
  for (const Tensor& p : parts) {
    RETURN_IF_ERROR(collective.Copy(p, out.Rows(begin, begin + p.dim(0))));
    begin += p.dim(0);
  }
  return out;
}

}  // namespace conveyor::engine
