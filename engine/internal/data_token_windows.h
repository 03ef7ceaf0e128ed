// The source the token kinds (tokens, llmc, megatron) share: one or more
// token streams cut into windows of seq_len + 1 tokens, blended by weight
// when there are several, with the documents of each window (engine/data.h).
// A kind's factory only opens and checks its files into TokenComponents.
//
// Not API: only engine/data*.cc include this.
#ifndef CONVEYOR_ENGINE_INTERNAL_DATA_TOKEN_WINDOWS_H_
#define CONVEYOR_ENGINE_INTERNAL_DATA_TOKEN_WINDOWS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data.h"
#include "engine/internal/data_token_stream.h"
#include "engine/megatron_index.h"

namespace conveyor::engine::data_internal {

// One data set: its token stream and, for megatron, its index (the source
// of document boundaries when no eod_token is given).
struct TokenComponent {
  TokenStream stream;
  std::shared_ptr<const MegatronIndex> index;  // Null but for megatron.
};

// The source over `components` (one, or a blend of two or more weighted by
// config.blend). Checks that each holds at least one window and, when its
// stream is at most kFullCheckBytes, every id (InvalidArgument naming the
// file); tells the kernel how the files will be read.
absl::StatusOr<std::unique_ptr<DataSource>> CreateTokenWindows(
    const DataConfig& config, const SampleShapes& shapes,
    std::vector<TokenComponent> components);

}  // namespace conveyor::engine::data_internal

#endif  // CONVEYOR_ENGINE_INTERNAL_DATA_TOKEN_WINDOWS_H_
