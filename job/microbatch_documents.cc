#include "job/microbatch_documents.h"

#include <utility>

#include "common/status_macros.h"

namespace conveyor::job {

bool StagesNeedDocuments(const engine::DocumentsConfig& config) {
  return config.reset_position_ids || config.document_mask;
}

absl::StatusOr<engine::MicrobatchDocuments> DocumentsFor(
    engine::DataSource& data, const engine::DocumentsConfig& config,
    int64_t step, int microbatch, int num_microbatches, int64_t batch_size) {
  if (!StagesNeedDocuments(config)) return engine::MicrobatchDocuments();
  ASSIGN_OR_RETURN(
      engine::MicrobatchDocuments documents,
      data.Documents(step, microbatch, num_microbatches, batch_size));
  if (!config.reset_position_ids) documents.positions.clear();
  if (!config.document_mask) documents.segments.clear();
  return documents;
}

absl::Status SetStageDocuments(engine::PipelineStage& stage, int label,
                               engine::DataSource& data,
                               const engine::DocumentsConfig& config,
                               int64_t step, int microbatch,
                               int num_microbatches, int64_t batch_size) {
  if (!StagesNeedDocuments(config)) return absl::OkStatus();
  ASSIGN_OR_RETURN(engine::MicrobatchDocuments documents,
                   DocumentsFor(data, config, step, microbatch,
                                num_microbatches, batch_size));
  return stage.SetDocuments(label, std::move(documents));
}

}  // namespace conveyor::job
