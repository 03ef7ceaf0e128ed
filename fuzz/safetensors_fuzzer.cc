// Fuzz target for the safetensors reader (engine/safetensors.h), which reads
// parameter and data files a user hands us: the input is the whole file.
//
// When the reader accepts the bytes, every tensor is read back (ReadF32 for
// the floating types, ReadI64 for the others) so the data-offset checks are
// exercised, and the file goes through the writer and the reader again: the
// second reading must find the same tensors, bytes and metadata. A broken
// property aborts, which libFuzzer reports as a crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/dtype.h"
#include "engine/safetensors.h"

namespace {

using conveyor::engine::SafetensorsReader;
using conveyor::engine::TensorInfo;

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "safetensors_fuzzer: property violated: %s %s\n", what,
               detail.c_str());
  std::abort();
}

bool SameBytes(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

void ReadAll(const SafetensorsReader& reader) {
  for (const TensorInfo& info : reader.tensors()) {
    if (reader.Find(info.name) != &info) Fail("Find misses", info.name);
    const std::span<const uint8_t> raw = reader.RawBytes(info);
    if (raw.size() != info.bytes()) Fail("RawBytes size", info.name);
    if (conveyor::engine::IsFloatingPoint(info.dtype)) {
      absl::StatusOr<std::vector<float>> values = reader.ReadF32(info.name);
      if (!values.ok()) Fail("ReadF32 fails", info.name);
      if (values->size() != static_cast<size_t>(info.numel())) {
        Fail("ReadF32 size", info.name);
      }
    } else {
      // May refuse (a U64 above INT64_MAX, a BOOL byte not 0/1), never crash.
      absl::StatusOr<std::vector<int64_t>> values = reader.ReadI64(info.name);
      if (values.ok() && values->size() != static_cast<size_t>(info.numel())) {
        Fail("ReadI64 size", info.name);
      }
      if (!values.ok() &&
          values.status().code() != absl::StatusCode::kInvalidArgument) {
        Fail("ReadI64 error code", info.name);
      }
    }
  }
}

// Writes what `reader` holds and reads it again.
void RoundTrip(const SafetensorsReader& reader) {
  std::vector<conveyor::engine::TensorToWrite> tensors;
  for (const TensorInfo& info : reader.tensors()) {
    // The reader takes an empty tensor name, the writer refuses one.
    if (info.name.empty()) return;
    const std::span<const uint8_t> raw = reader.RawBytes(info);
    tensors.push_back({.name = info.name,
                       .dtype = info.dtype,
                       .shape = info.shape,
                       .data = raw.data(),
                       .bytes = raw.size()});
  }
  absl::StatusOr<std::string> bytes =
      conveyor::engine::SerializeSafetensors(tensors, reader.metadata());
  if (!bytes.ok()) {
    Fail("the writer refuses what the reader accepted",
         std::string(bytes.status().message()));
  }
  absl::StatusOr<SafetensorsReader> again =
      SafetensorsReader::FromBytes(*std::move(bytes), "round trip");
  if (!again.ok()) {
    Fail("the reader refuses what the writer wrote",
         std::string(again.status().message()));
  }
  if (again->tensors().size() != reader.tensors().size()) {
    Fail("round trip changes the tensor count");
  }
  if (again->metadata() != reader.metadata()) {
    Fail("round trip changes the metadata");
  }
  for (const TensorInfo& info : reader.tensors()) {
    const TensorInfo* other = again->Find(info.name);
    if (other == nullptr || other->dtype != info.dtype ||
        other->shape != info.shape ||
        !SameBytes(again->RawBytes(*other), reader.RawBytes(info))) {
      Fail("round trip changes tensor", info.name);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes;
  if (size > 0) bytes.assign(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::FromBytes(std::move(bytes), "fuzz.safetensors");
  if (!reader.ok()) {
    const absl::StatusCode code = reader.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kResourceExhausted) {
      Fail("unexpected error code", std::string(reader.status().message()));
    }
    return 0;
  }
  ReadAll(*reader);
  RoundTrip(*reader);
  return 0;
}
