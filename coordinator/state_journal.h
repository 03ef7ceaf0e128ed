// The state file's journal ("<state-file>.journal"): the changes to the job
// records since the snapshot (coordinator/state_file.h) was written, one
// framed record per write, so that a write costs the records that changed
// rather than all of them.
//
// Layout (little-endian):
//
//   header  0 u8[4] magic "CVYJ"  4 u32 format (1)  8 u64 generation
//           16 u32 CRC-32C of bytes 0..16
//   record  0 u32 payload bytes   4 u32 CRC-32C of (generation, payload
//           bytes, sequence, payload)   8 u64 sequence (1, 2, ...)
//           16 payload (EncodeChanges)
//
// The generation ties a journal to the one snapshot it continues: a journal
// of an older generation is stale (its records are in the snapshot already)
// and is never replayed, and a record's checksum covers the generation, so
// a record of another generation never passes for one of this one.
//
// A write that a crash cut short leaves a torn last record: a record whose
// length runs past the end of the file, or whose checksum fails with no
// valid record after it. ParseJournal drops such a tail (and says so); a
// damaged record followed by valid ones is not a torn write but damage to
// records that were acknowledged, and is DataLoss.
//
// Pure functions of their arguments: thread-safe.
#ifndef CONVEYOR_COORDINATOR_STATE_JOURNAL_H_
#define CONVEYOR_COORDINATOR_STATE_JOURNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

inline constexpr uint32_t kJournalFormat = 1;
inline constexpr size_t kJournalHeaderBytes = 20;
inline constexpr size_t kJournalRecordHeaderBytes = 16;

// One write's changes: `changed` holds the version, next_job, the whole
// queue order (when `has_queue`) and the records of the jobs that changed
// (each replacing the record of the same id); `removed`, the numbers of the
// jobs forgotten since.
struct StateChanges {
  v1::CoordinatorState changed;
  bool has_queue = false;
  std::vector<uint64_t> removed;
};

std::string EncodeChanges(const StateChanges& changes);
// DataLoss naming what does not parse.
absl::StatusOr<StateChanges> DecodeChanges(absl::string_view payload);

std::string EncodeJournalHeader(uint64_t generation);
std::string EncodeJournalRecord(uint64_t generation, uint64_t sequence,
                                absl::string_view payload);

struct JournalRecord {
  uint64_t sequence = 0;
  uint64_t offset = 0;        // Of its frame in the file.
  absl::string_view payload;  // Into the parsed bytes.
};

struct ParsedJournal {
  uint64_t generation = 0;
  std::vector<JournalRecord> records;
  // The header and every whole, valid record: where the next record goes.
  uint64_t valid_bytes = 0;
  // Why the bytes after valid_bytes were dropped (a torn last write);
  // empty when there were none.
  std::string dropped_tail;
};

// The records of journal `bytes`. DataLoss with the byte offset for a
// missing or damaged header and for a damaged record that valid records
// follow; FailedPrecondition for a format newer than this release reads.
// A torn tail is not an error (ParsedJournal::dropped_tail). Never
// allocates by a length field: lengths are checked against the bytes.
absl::StatusOr<ParsedJournal> ParseJournal(absl::string_view bytes);

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_STATE_JOURNAL_H_
