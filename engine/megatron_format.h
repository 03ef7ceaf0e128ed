// The Megatron-LM / Megatron-Core indexed data set format (the `.bin` and
// `.idx` pair its preprocess_data.py writes), as this project reads
// (engine/megatron_index.h) and writes (engine/megatron_writer.h) it.
//
// PREFIX.bin holds the token ids of every sequence back to back, each id a
// little-endian integer of the data set's dtype. PREFIX.idx, all little
// endian:
//
//   offset  size     field
//   0       9        magic "MMIDIDX\0\0"
//   9       8        version, uint64: 1
//   17      1        dtype code, uint8 (MegatronDType)
//   18      8        sequence count S, uint64
//   26      8        document index entries D, uint64 (documents + 1)
//   34      4 S      sequence lengths in tokens, int32
//   34+4S   8 S      sequence pointers: byte offsets into .bin, int64
//   34+12S  8 D      document index, int64: 0, then the sequence index that
//                    ends each document; the last entry is S
//
// Document d is thus the sequences [index[d], index[d + 1]). Megatron's
// builders write one sequence per document for GPT data, and the pointers as
// the running sum of length x dtype size from 0.
//
// Thread-safe: constants and pure functions.
#ifndef CONVEYOR_ENGINE_MEGATRON_FORMAT_H_
#define CONVEYOR_ENGINE_MEGATRON_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::engine {

// Megatron's DType codes (megatron/core/datasets/indexed_dataset.py).
enum class MegatronDType : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};

inline constexpr char kMegatronIndexMagic[9] = {'M', 'M', 'I',  'D', 'I',
                                                'D', 'X', '\0', '\0'};
inline constexpr uint64_t kMegatronIndexVersion = 1;
// Magic, version, dtype code, sequence count, document index entries.
inline constexpr uint64_t kMegatronIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

// The dtype of `code`, or InvalidArgument naming the code and the known ones
// when Megatron defines no such code.
absl::StatusOr<MegatronDType> MegatronDTypeFromCode(int code);
// "uint8", "int8", "int16", "int32", "int64", "float64", "float32",
// "uint16".
absl::string_view MegatronDTypeName(MegatronDType dtype);
// The inverse of MegatronDTypeName; InvalidArgument listing the names.
absl::StatusOr<MegatronDType> ParseMegatronDType(absl::string_view name);
// Bytes per id: 1, 2, 4 or 8.
int MegatronDTypeBytes(MegatronDType dtype);
// False for float32 and float64, which cannot hold token ids exactly.
bool IsIntegerMegatronDType(MegatronDType dtype);
// Ids [0, result) fit the dtype: 256 for uint8, 128 for int8, ..., 2^63 for
// int64; 0 for the float dtypes.
uint64_t MegatronDTypeIdLimit(MegatronDType dtype);
// The smallest dtype Megatron uses for a vocabulary of `vocab_size` ids:
// uint16 when they fit, else int32.
MegatronDType MegatronDTypeForVocab(int64_t vocab_size);

// PREFIX.bin and PREFIX.idx.
std::string MegatronBinPath(absl::string_view prefix);
std::string MegatronIdxPath(absl::string_view prefix);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_MEGATRON_FORMAT_H_
