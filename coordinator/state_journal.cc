#include "coordinator/state_journal.h"

#include <span>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/little_endian.h"

namespace conveyor::coordinator {
namespace {

constexpr char kMagic[4] = {'C', 'V', 'Y', 'J'};
constexpr uint8_t kHasQueue = 1;

void Append64(std::string& out, uint64_t value) {
  char bytes[8];
  PutU64(bytes, value);
  out.append(bytes, sizeof(bytes));
}

void Append32(std::string& out, uint32_t value) {
  char bytes[4];
  PutU32(bytes, value);
  out.append(bytes, sizeof(bytes));
}

uint32_t Checksum(absl::string_view bytes, uint32_t crc = 0) {
  return Crc32c(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()),
                               bytes.size()),
      crc);
}

// A record's checksum: its generation, length and sequence, then its
// payload, so that a record moved from another journal or another place in
// this one fails as surely as a damaged one.
uint32_t RecordChecksum(uint64_t generation, uint32_t length, uint64_t sequence,
                        absl::string_view payload) {
  std::string head;
  Append64(head, generation);
  Append32(head, length);
  Append64(head, sequence);
  return Checksum(payload, Checksum(head));
}

// Whether a whole, valid record of `generation` with a sequence number
// after `after` starts at `offset`.
bool ValidRecordAt(absl::string_view bytes, uint64_t generation,
                   uint64_t offset, uint64_t after) {
  if (bytes.size() - offset < kJournalRecordHeaderBytes) return false;
  const char* p = bytes.data() + offset;
  const uint32_t length = GetU32(p);
  const uint64_t sequence = GetU64(p + 8);
  // Sequence numbers go up by one per record: a later one is at most one
  // per record header's worth of bytes past `after`. Most offsets stop here.
  if (sequence <= after || sequence - after > bytes.size()) return false;
  if (length > bytes.size() - offset - kJournalRecordHeaderBytes) return false;
  return GetU32(p + 4) ==
         RecordChecksum(
             generation, length, sequence,
             bytes.substr(offset + kJournalRecordHeaderBytes, length));
}

}  // namespace

std::string EncodeChanges(const StateChanges& changes) {
  std::string out;
  out.push_back(static_cast<char>(changes.has_queue ? kHasQueue : 0));
  Append32(out, static_cast<uint32_t>(changes.removed.size()));
  for (uint64_t number : changes.removed) Append64(out, number);
  if (changes.has_queue) {
    changes.changed.AppendToString(&out);
  } else {
    v1::CoordinatorState without_queue = changes.changed;
    without_queue.clear_queue();
    without_queue.AppendToString(&out);
  }
  return out;
}

absl::StatusOr<StateChanges> DecodeChanges(absl::string_view payload) {
  if (payload.size() < 5) {
    return absl::DataLossError(absl::StrCat("journal record of ",
                                            payload.size(),
                                            " bytes is shorter than its head"));
  }
  StateChanges out;
  const uint8_t flags = static_cast<uint8_t>(payload[0]);
  if ((flags & ~kHasQueue) != 0) {
    return absl::DataLossError(
        absl::StrCat("journal record has unknown flags ", flags));
  }
  out.has_queue = (flags & kHasQueue) != 0;
  const uint32_t removed = GetU32(payload.data() + 1);
  // Checked against the bytes before anything is allocated for them.
  if (removed > (payload.size() - 5) / 8) {
    return absl::DataLossError(absl::StrCat("journal record lists ", removed,
                                            " removed jobs but holds ",
                                            payload.size(), " bytes"));
  }
  out.removed.reserve(removed);
  for (uint32_t i = 0; i < removed; ++i) {
    out.removed.push_back(GetU64(payload.data() + 5 + 8 * i));
  }
  const absl::string_view message = payload.substr(5 + 8 * size_t{removed});
  if (!out.changed.ParseFromArray(message.data(),
                                  static_cast<int>(message.size()))) {
    return absl::DataLossError("journal record's records do not parse");
  }
  return out;
}

std::string EncodeJournalHeader(uint64_t generation) {
  std::string out(kMagic, sizeof(kMagic));
  Append32(out, kJournalFormat);
  Append64(out, generation);
  Append32(out, Checksum(out));
  return out;
}

std::string EncodeJournalRecord(uint64_t generation, uint64_t sequence,
                                absl::string_view payload) {
  const uint32_t length = static_cast<uint32_t>(payload.size());
  std::string out;
  out.reserve(kJournalRecordHeaderBytes + payload.size());
  Append32(out, length);
  Append32(out, RecordChecksum(generation, length, sequence, payload));
  Append64(out, sequence);
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<ParsedJournal> ParseJournal(absl::string_view bytes) {
  // The header is written whole, by a rename (StateFile): it is never torn.
  if (bytes.size() < kJournalHeaderBytes ||
      bytes.substr(0, sizeof(kMagic)) !=
          absl::string_view(kMagic, sizeof(kMagic))) {
    return absl::DataLossError(
        absl::StrCat("not a coordinator state journal (no CVYJ header in its ",
                     bytes.size(), " bytes)"));
  }
  const uint32_t format = GetU32(bytes.data() + 4);
  if (GetU32(bytes.data() + 16) != Checksum(bytes.substr(0, 16))) {
    return absl::DataLossError("journal header checksum mismatch (byte 16)");
  }
  if (format != kJournalFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("state journal format ", format, "; this release reads ",
                     kJournalFormat));
  }
  ParsedJournal out;
  out.generation = GetU64(bytes.data() + 8);
  uint64_t offset = kJournalHeaderBytes;
  uint64_t sequence = 0;
  while (offset < bytes.size()) {
    const uint64_t left = bytes.size() - offset;
    std::string problem;
    if (left < kJournalRecordHeaderBytes) {
      problem = absl::StrCat("a record header cut short (", left, " of ",
                             kJournalRecordHeaderBytes, " bytes)");
    } else {
      const char* p = bytes.data() + offset;
      const uint32_t length = GetU32(p);
      if (length > left - kJournalRecordHeaderBytes) {
        problem = absl::StrCat("a record of ", length, " bytes with only ",
                               left - kJournalRecordHeaderBytes, " left");
      } else if (GetU64(p + 8) != sequence + 1 ||
                 !ValidRecordAt(bytes, out.generation, offset, sequence)) {
        problem = "a record whose checksum or sequence number is wrong";
      } else {
        out.records.push_back(JournalRecord{
            .sequence = sequence + 1,
            .offset = offset,
            .payload =
                bytes.substr(offset + kJournalRecordHeaderBytes, length)});
        ++sequence;
        offset += kJournalRecordHeaderBytes + length;
        continue;
      }
    }
    // A torn write damages only the last record: a valid record further on
    // means acknowledged records were damaged, and dropping them (or
    // reading past them) would lose or misread acknowledged jobs.
    for (uint64_t later = offset + 1; later < bytes.size(); ++later) {
      if (ValidRecordAt(bytes, out.generation, later, sequence)) {
        return absl::DataLossError(
            absl::StrCat("damaged journal record at byte ", offset, " (",
                         problem, ") followed by a valid one at byte ", later));
      }
    }
    out.dropped_tail =
        absl::StrCat("dropped ", left, " bytes at byte ", offset, " (", problem,
                     "): a write cut short by a crash");
    break;
  }
  out.valid_bytes = offset;
  return out;
}

}  // namespace conveyor::coordinator
