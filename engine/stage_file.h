// The on-disk layout of a pipelined job's parameters, shared by the workers
// that write it and `conveyorctl export` that reads it:
//
//   <checkpoint.dir>/step-<N>/stage-<s>.safetensors
//
// one file per stage, with the metadata format (kStageFileFormat), job,
// stage, num_stages and step. Thread-safe (constants and pure functions).
#ifndef CONVEYOR_ENGINE_STAGE_FILE_H_
#define CONVEYOR_ENGINE_STAGE_FILE_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace conveyor::engine {

inline constexpr char kStageFileFormat[] = "conveyor-stage-v1";

// "<checkpoint_dir>/step-<step>/stage-<stage>.safetensors".
std::string StageFilePath(absl::string_view checkpoint_dir, int64_t step,
                          int stage);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_STAGE_FILE_H_
