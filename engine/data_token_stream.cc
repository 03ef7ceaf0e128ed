// TokenStream (engine/internal/data_token_stream.h): decoding and checking
// token ids straight from a memory-mapped file.
#include "engine/internal/data_token_stream.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"
#include "common/status_macros.h"

namespace conveyor::engine::data_internal {
namespace {

// Ids checked per chunk by CheckAll.
constexpr int64_t kCheckChunk = int64_t{1} << 20;

template <typename T>
void Decode(const uint8_t* p, int64_t n, int64_t* out) {
  using U = std::make_unsigned_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<int64_t>(
        static_cast<T>(LoadLittleEndian<U>(p + i * sizeof(T))));
  }
}

}  // namespace

absl::StatusOr<VocabBound> MakeVocabBound(const DataConfig& config,
                                          const SampleShapes& shapes,
                                          uint64_t dtype_limit,
                                          absl::string_view dtype_name) {
  if (config.vocab_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.vocab_size must be positive (or 0 for the model's vocabulary), "
        "got ",
        config.vocab_size));
  }
  VocabBound bound{.limit = INT64_MAX, .what = "no bound"};
  auto tighten = [&](uint64_t limit, std::string what) {
    if (limit > 0 && limit < static_cast<uint64_t>(bound.limit)) {
      bound = {.limit = static_cast<int64_t>(limit), .what = std::move(what)};
    }
  };
  // The configured bound first, so that it names the error when it equals
  // the model's.
  tighten(static_cast<uint64_t>(config.vocab_size), "data.vocab_size");
  tighten(static_cast<uint64_t>(std::max<int64_t>(shapes.vocab, 0)),
          "the model's vocabulary");
  tighten(dtype_limit, absl::StrCat("what ", dtype_name, " can hold"));
  return bound;
}

absl::Status TokenStream::Read(int64_t begin, int64_t n, int64_t* out) const {
  if (begin < 0 || n < 0 || begin > count_ - n) {
    return absl::InternalError(
        absl::StrCat(file_->path(), ": tokens [", begin, ", ", begin + n,
                     ") are outside the stream of ", count_));
  }
  // Copied out under MappedFile's SIGBUS guard: a file truncated under the
  // read fails this gather with DataLoss instead of killing the process.
  std::vector<uint8_t> raw(static_cast<size_t>(n) * encoding_.bytes);
  RETURN_IF_ERROR(file_->CopyOut(offset_ + begin * encoding_.bytes, raw.size(),
                                 raw.data()));
  const uint8_t* p = raw.data();
  switch (encoding_.bytes * (encoding_.is_signed ? -1 : 1)) {
    case 1:
      Decode<uint8_t>(p, n, out);
      break;
    case -1:
      Decode<int8_t>(p, n, out);
      break;
    case 2:
      Decode<uint16_t>(p, n, out);
      break;
    case -2:
      Decode<int16_t>(p, n, out);
      break;
    case 4:
      Decode<uint32_t>(p, n, out);
      break;
    case -4:
      Decode<int32_t>(p, n, out);
      break;
    case -8:
      Decode<int64_t>(p, n, out);
      break;
    default:
      return absl::InternalError(absl::StrCat(
          file_->path(), ": no decoder for ", encoding_.name, " ids"));
  }
  file_->ReleaseEvery(static_cast<uint64_t>(n) * encoding_.bytes,
                      kReleasePeriodBytes);
  const int64_t limit = vocab_.limit;
  for (int64_t i = 0; i < n; ++i) {
    if (out[i] < 0 || out[i] >= limit) [[unlikely]] {
      return OutOfVocabulary(begin + i, out[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status TokenStream::CheckAll() const {
  std::vector<int64_t> buffer(
      static_cast<size_t>(std::min(count_, kCheckChunk)));
  for (int64_t begin = 0; begin < count_; begin += kCheckChunk) {
    const int64_t n = std::min(kCheckChunk, count_ - begin);
    RETURN_IF_ERROR(Read(begin, n, buffer.data()));
  }
  file_->Release(offset_, static_cast<uint64_t>(count_) * encoding_.bytes);
  return absl::OkStatus();
}

absl::Status TokenStream::OutOfVocabulary(int64_t index, int64_t id) const {
  const uint64_t byte =
      offset_ + static_cast<uint64_t>(index) * encoding_.bytes;
  if (id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_->path(), ": the token at byte offset ", byte, " is ",
                     id, ", a negative id"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(file_->path(), ": the token at byte offset ", byte, " is ",
                   id, ", not below ", vocab_.what, " ", vocab_.limit));
}

}  // namespace conveyor::engine::data_internal
