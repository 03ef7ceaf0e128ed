// Fuzz target for checkpoint manifests (checkpoint/manifest.h), which
// resume and `conveyorctl export` read back from a checkpoint directory
// anyone with access to it could have edited: the input is the file's text.
//
// A manifest the parser accepts must be consistent (every stage once, in
// order, under its one allowed file name) and survive a round trip: written
// with ManifestToJson and parsed again it is the same manifest, and written
// again the same text. Errors must be InvalidArgument (ResourceExhausted if
// memory runs out). A broken property aborts, which libFuzzer reports as a
// crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/manifest.h"

namespace {

using conveyor::checkpoint::CheckpointManifest;

[[noreturn]] void Fail(const char* what, absl::string_view detail = "") {
  std::fprintf(stderr, "manifest_fuzzer: property violated: %s %.*s\n", what,
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

void CheckConsistent(const CheckpointManifest& m) {
  if (m.num_stages < 1 ||
      m.num_stages > conveyor::checkpoint::kMaxManifestStages ||
      m.stages.size() != static_cast<size_t>(m.num_stages) ||
      m.stage_begin.size() != static_cast<size_t>(m.num_stages)) {
    Fail("stage counts disagree");
  }
  for (int s = 0; s < m.num_stages; ++s) {
    if (m.stages[s].stage != s) Fail("stages not in stage order");
    if (m.stages[s].file != conveyor::checkpoint::StageFileName(s)) {
      Fail("a stage file name other than stage-<s>.safetensors",
           m.stages[s].file);
    }
    if (s == 0 ? m.stage_begin[0] != 0
               : m.stage_begin[s] <= m.stage_begin[s - 1]) {
      Fail("stage_begin does not increase from 0");
    }
  }
  if (m.step < 0 || m.created_unix_ms < 0 || m.config_hash.empty()) {
    Fail("a field out of range");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<CheckpointManifest> manifest =
      conveyor::checkpoint::ParseManifest(text, "fuzz/manifest.json");
  if (!manifest.ok()) {
    const absl::StatusCode code = manifest.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kResourceExhausted) {
      Fail("unexpected error code", manifest.status().message());
    }
    return 0;
  }
  CheckConsistent(*manifest);
  const std::string json = conveyor::checkpoint::ManifestToJson(*manifest);
  absl::StatusOr<CheckpointManifest> again =
      conveyor::checkpoint::ParseManifest(json, "round trip");
  if (!again.ok()) {
    Fail("the parser refuses what the writer wrote", again.status().message());
  }
  if (!(*again == *manifest)) Fail("round trip changes the manifest", json);
  if (conveyor::checkpoint::ManifestToJson(*again) != json) {
    Fail("writing the same manifest twice gives different text");
  }
  return 0;
}
