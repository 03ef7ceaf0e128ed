#include "engine/megatron_index.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"
#include "common/status_macros.h"

namespace conveyor::engine {
namespace {

constexpr uint64_t kVersionOffset = 9;
constexpr uint64_t kDTypeOffset = 17;
constexpr uint64_t kSequencesOffset = 18;
constexpr uint64_t kEntriesOffset = 26;

}  // namespace

absl::StatusOr<std::unique_ptr<MegatronIndex>> MegatronIndex::Open(
    const std::string& idx_path, const std::string& bin_path,
    uint64_t bin_bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file,
                   MappedFile::Open(idx_path));
  auto bad = [&](auto&&... message) {
    return absl::InvalidArgumentError(absl::StrCat(idx_path, ": ", message...));
  };
  const uint8_t* p = file->data();
  const uint64_t size = file->size();
  if (size < kMegatronIndexHeaderBytes) {
    return bad(size, " bytes is too short for a Megatron index header (",
               kMegatronIndexHeaderBytes, " bytes)");
  }
  if (std::memcmp(p, kMegatronIndexMagic, sizeof(kMegatronIndexMagic)) != 0) {
    return bad(
        "not a Megatron index: bytes 0-8 are not the magic \"MMIDIDX\\0\\0\"");
  }
  const uint64_t version = GetU64(p + kVersionOffset);
  if (version != kMegatronIndexVersion) {
    return bad("version ", version, " at byte ", kVersionOffset,
               " is not the version this reader knows (1)");
  }
  const int code = p[kDTypeOffset];
  absl::StatusOr<MegatronDType> dtype = MegatronDTypeFromCode(code);
  if (!dtype.ok()) {
    return bad("byte ", kDTypeOffset, ": ", dtype.status().message());
  }
  if (!IsIntegerMegatronDType(*dtype)) {
    return bad("dtype code ", code, " (", MegatronDTypeName(*dtype),
               ") at byte ", kDTypeOffset,
               " is not an integer type; token ids must be integers");
  }
  const uint64_t sequences = GetU64(p + kSequencesOffset);
  const uint64_t entries = GetU64(p + kEntriesOffset);
  // Bound each count by the file before multiplying, so nothing overflows.
  const uint64_t body = size - kMegatronIndexHeaderBytes;
  if (sequences > body / 12 || entries > body / 8 ||
      12 * sequences + 8 * entries != body) {
    return bad(sequences, " sequences (byte ", kSequencesOffset, ") and ",
               entries, " document index entries (byte ", kEntriesOffset,
               ") need ",
               sequences <= body / 12 && entries <= body / 8
                   ? absl::StrCat(kMegatronIndexHeaderBytes + 12 * sequences +
                                      8 * entries,
                                  " bytes")
                   : std::string("more bytes"),
               ", but the file has ", size);
  }
  if (entries == 0) {
    return bad("the document index is empty (byte ", kEntriesOffset,
               "); it must hold at least the leading 0");
  }
  std::unique_ptr<MegatronIndex> index(new MegatronIndex(
      std::move(file), *dtype, static_cast<int64_t>(sequences),
      static_cast<int64_t>(entries)));
  RETURN_IF_ERROR(index->CheckBody(bin_path, bin_bytes));
  return index;
}

absl::Status MegatronIndex::CheckBody(const std::string& bin_path,
                                      uint64_t bin_bytes) {
  const std::string& idx_path = file_->path();
  auto bad = [&](auto&&... message) {
    return absl::InvalidArgumentError(absl::StrCat(idx_path, ": ", message...));
  };
  const uint64_t lengths_at = kMegatronIndexHeaderBytes;
  const uint64_t pointers_at = lengths_at + 4 * sequences_;
  const uint64_t documents_at = pointers_at + 8 * sequences_;
  const uint64_t item = MegatronDTypeBytes(dtype_);
  uint64_t end = 0;  // Where the previous sequence ends in the .bin.
  for (int64_t i = 0; i < sequences_; ++i) {
    const int32_t length = sequence_length(i);
    if (length < 0) {
      return bad("sequence ", i, " has length ", length, " (byte ",
                 lengths_at + 4 * i, ")");
    }
    const int64_t pointer = sequence_pointer(i);
    if (pointer < 0 || static_cast<uint64_t>(pointer) != end) {
      return bad("sequence ", i, " starts at byte ", pointer, " of ", bin_path,
                 " (pointer at byte ", pointers_at + 8 * i, "), but ",
                 i == 0 ? std::string("the first must start at 0")
                        : absl::StrCat("sequence ", i - 1, " ends at ", end),
                 "; this reader takes sequences stored back to back, as "
                 "Megatron's builders write them");
    }
    end += static_cast<uint64_t>(length) * item;
    if (end > bin_bytes) {
      return bad("sequence ", i, " (", length, " tokens from byte ", pointer,
                 ") runs past the end of ", bin_path, " (", bin_bytes,
                 " bytes): the .bin is truncated or belongs to another "
                 "index");
    }
  }
  if (end != bin_bytes) {
    return bad("the sequences end at byte ", end, " but ", bin_path, " has ",
               bin_bytes, " bytes: the .bin belongs to another index");
  }
  num_tokens_ = static_cast<int64_t>(end / item);
  int64_t previous = 0;
  for (int64_t j = 0; j < entries_; ++j) {
    const int64_t entry = document_index(j);
    const uint64_t at = documents_at + 8 * j;
    if (j == 0 && entry != 0) {
      return bad("the document index starts with ", entry, " (byte ", at,
                 "), not 0");
    }
    if (entry < previous || entry > sequences_) {
      return bad("document index entry ", j, " is ", entry, " (byte ", at,
                 "); entries must be non-decreasing sequence indices in [0, ",
                 sequences_, "]");
    }
    previous = entry;
  }
  if (previous != sequences_) {
    return bad("the document index ends at sequence ", previous, " (byte ",
               documents_at + 8 * (entries_ - 1),
               "), not at the sequence "
               "count ",
               sequences_);
  }
  // The scan touched every page; leave them to the page cache.
  file_->Release(0, file_->size());
  return absl::OkStatus();
}

int32_t MegatronIndex::sequence_length(int64_t i) const {
  return static_cast<int32_t>(
      GetU32(file_->data() + kMegatronIndexHeaderBytes + 4 * i));
}

int64_t MegatronIndex::sequence_pointer(int64_t i) const {
  return static_cast<int64_t>(GetU64(file_->data() + kMegatronIndexHeaderBytes +
                                     4 * sequences_ + 8 * i));
}

int64_t MegatronIndex::document_index(int64_t j) const {
  return static_cast<int64_t>(GetU64(file_->data() + kMegatronIndexHeaderBytes +
                                     12 * sequences_ + 8 * j));
}

int64_t MegatronIndex::DocumentStart(int64_t d) const {
  const int64_t s = document_index(d);
  if (s >= sequences_) return num_tokens_;
  return sequence_pointer(s) / MegatronDTypeBytes(dtype_);
}

int64_t MegatronIndex::DocumentAt(int64_t t) const {
  // The last d in [0, document_count()) with DocumentStart(d) <= t;
  // DocumentStart(0) is 0 <= t.
  int64_t lo = 0, hi = document_count() - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (DocumentStart(mid) <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace conveyor::engine
