// What each stage gets of a microbatch's documents (engine/documents.h): the
// layout the data source computes (engine/data.h, DataSource::Documents),
// kept as far as `data.documents` asks: per-token positions only with
// reset_position_ids, the document mask only with document_mask.
// (eod_mask_loss needs neither: the data source writes kIgnoredTarget into
// the targets.) The pipelined executor calls it for each of its stages and
// the in-process reference once per microbatch for all of its stages, so
// their stages see the same documents.
#ifndef CONVEYOR_JOB_MICROBATCH_DOCUMENTS_H_
#define CONVEYOR_JOB_MICROBATCH_DOCUMENTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/data.h"
#include "engine/documents.h"
#include "engine/pipeline_stage.h"

namespace conveyor::job {

// Whether stages need documents at all for `config`.
bool StagesNeedDocuments(const engine::DocumentsConfig& config);

// The documents of microbatch `microbatch` of `num_microbatches` of step
// `step`; empty when the stages need none. The data source's errors.
absl::StatusOr<engine::MicrobatchDocuments> DocumentsFor(
    engine::DataSource& data, const engine::DocumentsConfig& config,
    int64_t step, int microbatch, int num_microbatches, int64_t batch_size);

// DocumentsFor, handed to `stage` under `label` (the microbatch, or an
// evaluation's label); a no-op when the stages need none.
absl::Status SetStageDocuments(engine::PipelineStage& stage, int label,
                               engine::DataSource& data,
                               const engine::DocumentsConfig& config,
                               int64_t step, int microbatch,
                               int num_microbatches, int64_t batch_size);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_MICROBATCH_DOCUMENTS_H_
