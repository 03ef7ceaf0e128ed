// SerializeSafetensors and WriteSafetensors (engine/safetensors.h): lays
// tensors out as the reference writer does and replaces a file atomically.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "engine/internal/safetensors_format.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"

namespace conveyor::engine {
namespace {

using safetensors_internal::CheckedByteSize;
using safetensors_internal::kLengthPrefixBytes;
using safetensors_internal::kMaxHeaderBytes;
using safetensors_internal::kMetadataKey;
using safetensors_internal::ShapeString;

// Keeps insertion order so the written header reads in layout order, with
// "__metadata__" first, as the reference writer produces it.
using OrderedJson = nlohmann::ordered_json;

struct Layout {
  // The padded JSON header, without the length prefix.
  std::string header;
  // Tensors in data buffer order.
  std::vector<const TensorToWrite*> order;
};

absl::StatusOr<Layout> PlanLayout(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const TensorToWrite& t : tensors) {
    const std::string where = absl::StrCat("tensor '", t.name, "'");
    if (t.name.empty()) {
      return absl::InvalidArgumentError("tensor name must not be empty");
    }
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name is reserved for metadata"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": name given twice"));
    }
    for (int64_t dim : t.shape) {
      if (dim < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": shape ", ShapeString(t.shape), " has a negative size"));
      }
    }
    uint64_t needed = 0;
    if (!CheckedByteSize(t.dtype, t.shape, &needed)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape ", ShapeString(t.shape),
                       " has more elements than fit in 64 bits"));
    }
    if (needed != t.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", t.bytes, " bytes given but ", DTypeName(t.dtype), " ",
          ShapeString(t.shape), " needs ", needed));
    }
    if (t.bytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": data is null"));
    }
  }

  Layout layout;
  for (const TensorToWrite& t : tensors) layout.order.push_back(&t);
  // Larger elements first: with the data buffer 8-byte aligned, every tensor
  // then starts at a multiple of its element size (the reference writer's
  // rule), so a mapped file can be read in place. Names break ties so the
  // bytes do not depend on the caller's order.
  std::sort(layout.order.begin(), layout.order.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) {
              const size_t sa = DTypeSize(a->dtype);
              const size_t sb = DTypeSize(b->dtype);
              if (sa != sb) return sa > sb;
              return a->name < b->name;
            });

  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson& meta = header[std::string(kMetadataKey)];
    meta = OrderedJson::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
  }
  uint64_t offset = 0;
  for (const TensorToWrite* t : layout.order) {
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = std::string(DTypeName(t->dtype));
    entry["shape"] = t->shape;
    // Cannot overflow: the buffers exist in memory.
    entry["data_offsets"] = OrderedJson::array({offset, offset + t->bytes});
    offset += t->bytes;
    header[t->name] = std::move(entry);
  }
  try {
    layout.header = header.dump();
  } catch (const OrderedJson::exception& e) {
    // dump() throws only on strings that are not UTF-8.
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor names and metadata must be valid UTF-8: ", e.what()));
  }
  // Spaces are JSON whitespace: padding to a multiple of 8 puts the data
  // buffer (after the 8-byte prefix) on an 8-byte boundary.
  layout.header.append((8 - layout.header.size() % 8) % 8, ' ');
  if (layout.header.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header would be ", layout.header.size(),
                     " bytes; readers refuse more than ", kMaxHeaderBytes));
  }
  return layout;
}

std::string LengthPrefix(uint64_t length) {
  std::string prefix(kLengthPrefixBytes, '\0');
  for (size_t i = 0; i < kLengthPrefixBytes; ++i) {
    prefix[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  }
  return prefix;
}

absl::Status WriteAll(int fd, const void* data, size_t size,
                      absl::string_view path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "write");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Makes the rename durable: it lives in the directory, not in the file.
absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, dir, "open directory");
  absl::Status status = absl::OkStatus();
  if (::fsync(fd) != 0) status = ErrnoError(errno, dir, "fsync directory");
  ::close(fd);
  return status;
}

}  // namespace

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(Layout layout, PlanLayout(tensors, metadata));
  size_t total = kLengthPrefixBytes + layout.header.size();
  for (const TensorToWrite* t : layout.order) total += t->bytes;
  std::string out;
  out.reserve(total);
  out += LengthPrefix(layout.header.size());
  out += layout.header;
  for (const TensorToWrite* t : layout.order) {
    if (t->bytes > 0) out.append(static_cast<const char*>(t->data), t->bytes);
  }
  return out;
}

absl::Status WriteSafetensors(
    const std::string& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(Layout layout, PlanLayout(tensors, metadata));
  // Written beside the destination (a rename cannot cross filesystems), so a
  // crash or error midway never leaves a partial file under `path`.
  const std::string temp = absl::StrCat(path, ".tmp-", ::getpid());
  const int fd =
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, temp, "open for writing");

  absl::Status status = [&]() -> absl::Status {
    const std::string prefix = LengthPrefix(layout.header.size());
    RETURN_IF_ERROR(WriteAll(fd, prefix.data(), prefix.size(), temp));
    RETURN_IF_ERROR(
        WriteAll(fd, layout.header.data(), layout.header.size(), temp));
    for (const TensorToWrite* t : layout.order) {
      RETURN_IF_ERROR(WriteAll(fd, t->data, t->bytes, temp));
    }
    // The data must be on disk before the rename publishes it; otherwise a
    // crash could leave the new name pointing at an empty file.
    if (::fsync(fd) != 0) return ErrnoError(errno, temp, "fsync");
    return absl::OkStatus();
  }();
  // close() can report a deferred write error (e.g. NFS), so it counts.
  if (::close(fd) != 0 && status.ok()) {
    status = ErrnoError(errno, temp, "close");
  }
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, path, absl::StrCat("rename from ", temp));
  }
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  return SyncDirectory(DirectoryOf(path));
}

}  // namespace conveyor::engine
