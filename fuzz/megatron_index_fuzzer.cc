// Fuzz target for the Megatron index reader (engine/megatron_index.h), which
// checks a `.idx` a user hands us against its `.bin`. The input is the .bin's
// size (8 bytes, little-endian, taken modulo 2^32) followed by the whole
// .idx; the reader maps files, so the .idx goes through a temporary file.
//
// When the reader accepts the pair, the promises it makes are checked: the
// sequences fill the .bin exactly, document starts never decrease, and
// DocumentAt finds, for sampled tokens, the last document starting at or
// before them. A broken property aborts, which libFuzzer reports as a crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "common/little_endian.h"
#include "engine/megatron_format.h"
#include "engine/megatron_index.h"

namespace {

using conveyor::engine::MegatronIndex;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "megatron_index_fuzzer: property violated: %s\n", what);
  std::abort();
}

const std::string& TempPath() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr ? dir : "/tmp") +
           "/megatron_index_fuzzer." + std::to_string(::getpid()) + ".idx";
  }();
  return path;
}

void Check(const MegatronIndex& index, uint64_t bin_bytes) {
  const int64_t item = conveyor::engine::MegatronDTypeBytes(index.dtype());
  if (static_cast<uint64_t>(index.num_tokens() * item) != bin_bytes) {
    Fail("the sequences do not fill the .bin");
  }
  const int64_t documents = index.document_count();
  if (index.DocumentStart(0) != 0) Fail("document 0 does not start at 0");
  if (index.DocumentStart(documents) != index.num_tokens()) {
    Fail("the last document does not end the stream");
  }
  // Bounded: the index may list millions of documents.
  const int64_t step = documents / 1024 + 1;
  for (int64_t d = 0; d + step <= documents; d += step) {
    if (index.DocumentStart(d) > index.DocumentStart(d + step)) {
      Fail("document starts decrease");
    }
  }
  const int64_t tokens = index.num_tokens();
  for (int64_t t = 0; t < tokens; t += tokens / 64 + 1) {
    const int64_t d = index.DocumentAt(t);
    if (d < 0 || d >= documents) Fail("DocumentAt out of range");
    if (index.DocumentStart(d) > t || index.DocumentStart(d + 1) <= t) {
      Fail("DocumentAt is not the document holding the token");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  const uint64_t bin_bytes = conveyor::GetU64(data) & 0xFFFFFFFFu;
  {
    std::ofstream out(TempPath(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 8),
              static_cast<std::streamsize>(size - 8));
    if (!out.good()) Fail("cannot write the temporary .idx");
  }
  absl::StatusOr<std::unique_ptr<MegatronIndex>> index =
      MegatronIndex::Open(TempPath(), "fuzz.bin", bin_bytes);
  if (index.ok()) {
    Check(**index, bin_bytes);
  } else if (index.status().code() != absl::StatusCode::kInvalidArgument) {
    // An empty .idx is InvalidArgument too ("empty file"); anything else
    // means the reader failed in a way a bad file should not cause.
    Fail("unexpected error code");
  }
  ::unlink(TempPath().c_str());
  return 0;
}
