#include "checkpoint/manifest.h"

#include <fcntl.h>  // posix_fadvise
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <exception>
#include <filesystem>
#include <limits>
#include <new>
#include <set>
#include <span>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/layout.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "nlohmann/json.hpp"

namespace conveyor::checkpoint {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
// Keeps keys in insertion order, which gives the written manifest its fixed
// layout ("format" first, the stages after the scalars).
using OrderedJson = nlohmann::ordered_json;

// A manifest is three levels deep (object, stages array, stage object). The
// cap keeps a hostile "[[[[..." far from any recursion in the JSON library.
constexpr int kMaxJsonDepth = 8;
// Stage files are read in chunks this large: big enough that the syscalls
// cost nothing next to the CRC, small enough to sit in L2.
constexpr size_t kReadChunkBytes = size_t{1} << 20;

// ---------------------------------------------------------------------------
// Parsing.

absl::Status FieldError(absl::string_view source, absl::string_view field,
                        absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": ", field, ": ", message));
}

// A short, printable rendition of a JSON value for error messages.
std::string Describe(const Json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true,
                                Json::error_handler_t::replace);
  if (text.size() > 64) text = absl::StrCat(text.substr(0, 61), "...");
  return absl::StrCat(value.type_name(), " ", text);
}

// Parses `text` as JSON strictly (common/strict_json.h): a duplicate key
// would let two writers' values hide each other.
absl::StatusOr<Json> ParseManifestText(absl::string_view text,
                                       absl::string_view source) {
  absl::StatusOr<Json> json =
      ParseStrictJson(text, "manifest", {.max_depth = kMaxJsonDepth});
  if (!json.ok()) {
    return absl::Status(json.status().code(),
                        absl::StrCat(source, ": ", json.status().message()));
  }
  return json;
}

// Reads the fields of one JSON object, each at most once, and rejects the
// keys nobody asked for, so a typo or a field from a newer format is an
// error rather than ignored.
class ObjectReader {
 public:
  // `object` must be an object and outlive the reader.
  ObjectReader(const Json& object, absl::string_view source, std::string path)
      : object_(object), source_(source), path_(std::move(path)) {}

  std::string Field(absl::string_view key) const {
    return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
  }

  absl::Status Error(absl::string_view key, absl::string_view message) const {
    return FieldError(source_, Field(key), message);
  }

  absl::StatusOr<const Json*> Get(absl::string_view key) {
    known_.insert(std::string(key));
    auto it = object_.find(std::string(key));
    if (it == object_.end()) return Error(key, "missing");
    return &*it;
  }

  bool Has(absl::string_view key) const {
    return object_.contains(std::string(key));
  }

  absl::StatusOr<std::string> String(absl::string_view key) {
    ASSIGN_OR_RETURN(const Json* value, Get(key));
    if (!value->is_string()) {
      return Error(key,
                   absl::StrCat("must be a string; got ", Describe(*value)));
    }
    return value->get<std::string>();
  }

  absl::StatusOr<int64_t> Int(absl::string_view key, int64_t min, int64_t max) {
    ASSIGN_OR_RETURN(const Json* value, Get(key));
    return IntValue(*value, Field(key), min, max);
  }

  absl::StatusOr<uint64_t> Uint64(absl::string_view key) {
    ASSIGN_OR_RETURN(const Json* value, Get(key));
    if (value->is_number_unsigned()) return value->get<uint64_t>();
    if (value->is_number_integer() && value->get<int64_t>() >= 0) {
      return static_cast<uint64_t>(value->get<int64_t>());
    }
    return Error(key, absl::StrCat("must be a non-negative integer; got ",
                                   Describe(*value)));
  }

  // An integer in [min, max] (1.0 and 1e3 are not integers).
  absl::StatusOr<int64_t> IntValue(const Json& value, absl::string_view field,
                                   int64_t min, int64_t max) const {
    int64_t n = 0;
    // The library stores every non-negative integer as unsigned.
    if (value.is_number_unsigned()) {
      const uint64_t u = value.get<uint64_t>();
      if (u > static_cast<uint64_t>(max)) {
        return FieldError(
            source_, field,
            absl::StrCat("must be in [", min, ", ", max, "]; got ", u));
      }
      n = static_cast<int64_t>(u);
    } else if (value.is_number_integer()) {
      n = value.get<int64_t>();
    } else {
      return FieldError(
          source_, field,
          absl::StrCat("must be an integer; got ", Describe(value)));
    }
    if (n < min || n > max) {
      return FieldError(
          source_, field,
          absl::StrCat("must be in [", min, ", ", max, "]; got ", n));
    }
    return n;
  }

  // Rejects the first key not read through Get().
  absl::Status CheckNoUnknownKeys() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!known_.contains(it.key())) {
        return FieldError(
            source_, path_.empty() ? "(top level)" : path_,
            absl::StrCat("unknown key \"",
                         absl::CHexEscape(it.key().substr(0, 64)), "\""));
      }
    }
    return absl::OkStatus();
  }

 private:
  const Json& object_;
  absl::string_view source_;
  std::string path_;
  std::set<std::string> known_;
};

bool IsLowerHex(absl::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c)) ||
           (c >= 'a' && c <= 'f');
  });
}

absl::StatusOr<StageFileDigest> ParseStage(const Json& value,
                                           absl::string_view source,
                                           const std::string& path,
                                           int num_stages) {
  if (!value.is_object()) {
    return FieldError(source, path,
                      absl::StrCat("must be an object; got ", Describe(value)));
  }
  ObjectReader r(value, source, path);
  StageFileDigest d;
  ASSIGN_OR_RETURN(int64_t stage, r.Int("stage", 0, num_stages - 1));
  d.stage = static_cast<int>(stage);
  ASSIGN_OR_RETURN(d.file, r.String("file"));
  // The only name allowed, which also rules out "../" and absolute paths:
  // a manifest can never make a reader open a file outside the step.
  if (d.file != StageFileName(d.stage)) {
    return r.Error("file",
                   absl::StrCat("must be \"", StageFileName(d.stage),
                                "\" for stage ", d.stage, "; got \"",
                                absl::CHexEscape(d.file.substr(0, 64)), "\""));
  }
  ASSIGN_OR_RETURN(d.bytes, r.Uint64("bytes"));
  ASSIGN_OR_RETURN(std::string crc, r.String("crc32c"));
  uint32_t crc_value = 0;
  if (crc.size() != 8 || !IsLowerHex(crc) ||
      !absl::SimpleHexAtoi(crc, &crc_value)) {
    return r.Error("crc32c",
                   absl::StrCat("must be 8 lowercase hex digits; got \"",
                                absl::CHexEscape(crc.substr(0, 16)), "\""));
  }
  d.crc32c = crc_value;
  RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  return d;
}

absl::StatusOr<CheckpointManifest> ParseManifestJson(const Json& json,
                                                     absl::string_view source) {
  if (!json.is_object()) {
    return FieldError(source, "(top level)",
                      absl::StrCat("must be an object; got ", Describe(json)));
  }
  ObjectReader r(json, source, "");
  CheckpointManifest m;
  ASSIGN_OR_RETURN(std::string format, r.String("format"));
  if (format != kManifestFormat) {
    return r.Error("format",
                   absl::StrCat("must be \"", kManifestFormat, "\"; got \"",
                                absl::CHexEscape(format.substr(0, 64)), "\""));
  }
  ASSIGN_OR_RETURN(m.job, r.String("job"));
  ASSIGN_OR_RETURN(m.job_id, r.String("job_id"));
  ASSIGN_OR_RETURN(m.step,
                   r.Int("step", 0, std::numeric_limits<int64_t>::max()));
  ASSIGN_OR_RETURN(m.config_hash, r.String("config_hash"));
  if (m.config_hash.empty()) return r.Error("config_hash", "must not be empty");
  // Absent from manifests written before it was recorded.
  if (r.Has("training_hash")) {
    ASSIGN_OR_RETURN(m.training_hash, r.String("training_hash"));
    if (m.training_hash.empty()) {
      return r.Error("training_hash", "must not be empty when present");
    }
  }
  // Absent from manifests written before it was recorded, and for job
  // files over the cap.
  if (r.Has("job_yaml")) {
    ASSIGN_OR_RETURN(m.job_yaml, r.String("job_yaml"));
    if (m.job_yaml.empty()) {
      return r.Error("job_yaml", "must not be empty when present");
    }
    if (m.job_yaml.size() > static_cast<size_t>(kMaxRecordedJobBytes)) {
      return r.Error("job_yaml",
                     absl::StrCat("must be at most ", kMaxRecordedJobBytes,
                                  " bytes; got ", m.job_yaml.size()));
    }
  }
  ASSIGN_OR_RETURN(int64_t num_stages,
                   r.Int("num_stages", 1, kMaxManifestStages));
  m.num_stages = static_cast<int>(num_stages);

  ASSIGN_OR_RETURN(const Json* begins, r.Get("stage_begin"));
  if (!begins->is_array() ||
      begins->size() != static_cast<size_t>(num_stages)) {
    return r.Error("stage_begin",
                   absl::StrCat("must be a list of num_stages (", num_stages,
                                ") first layers; got ", Describe(*begins)));
  }
  for (size_t i = 0; i < begins->size(); ++i) {
    const std::string field = absl::StrCat("stage_begin[", i, "]");
    ASSIGN_OR_RETURN(int64_t begin,
                     r.IntValue((*begins)[i], field, 0, INT_MAX));
    if (i == 0 ? begin != 0 : begin <= m.stage_begin.back()) {
      return FieldError(
          source, field,
          absl::StrCat("is ", begin,
                       "; the first layers must start at 0 and strictly "
                       "increase"));
    }
    m.stage_begin.push_back(static_cast<int>(begin));
  }

  ASSIGN_OR_RETURN(const Json* stages, r.Get("stages"));
  if (!stages->is_array() ||
      stages->size() != static_cast<size_t>(num_stages)) {
    return r.Error("stages",
                   absl::StrCat("must be a list of num_stages (", num_stages,
                                ") stage files; got ", Describe(*stages)));
  }
  std::vector<bool> seen(static_cast<size_t>(num_stages), false);
  for (size_t i = 0; i < stages->size(); ++i) {
    const std::string field = absl::StrCat("stages[", i, "]");
    ASSIGN_OR_RETURN(StageFileDigest d,
                     ParseStage((*stages)[i], source, field, m.num_stages));
    if (seen[d.stage]) {
      return FieldError(source, absl::StrCat(field, ".stage"),
                        absl::StrCat("stage ", d.stage, " appears twice"));
    }
    seen[d.stage] = true;
    m.stages.push_back(std::move(d));
  }
  // num_stages entries, each in range and none twice: every stage is there.
  std::sort(m.stages.begin(), m.stages.end(),
            [](const StageFileDigest& a, const StageFileDigest& b) {
              return a.stage < b.stage;
            });

  ASSIGN_OR_RETURN(
      m.created_unix_ms,
      r.Int("created_unix_ms", 0, std::numeric_limits<int64_t>::max()));
  RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  return m;
}

// ---------------------------------------------------------------------------
// Files.

struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Size and CRC-32C of the regular file at `path`, read in chunks.
absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  ASSIGN_OR_RETURN(RegularFile file, OpenRegularFile(path));
  const int fd = file.fd.get();
  // Advisory: read-ahead helps a multi-GB sequential scan; failure is fine.
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<uint8_t> buffer(kReadChunkBytes);
  FileDigest digest;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "read");
    }
    if (n == 0) break;
    const size_t got = static_cast<size_t>(n);
    digest.crc32c =
        Crc32c(std::span<const uint8_t>(buffer.data(), got), digest.crc32c);
    digest.bytes += got;
  }
  return digest;
}

std::string Hex32(uint32_t value) { return absl::StrFormat("%08x", value); }

// Checks one stage file of a step against its manifest entry.
absl::Status CheckStageFile(const std::string& step_dir,
                            const StageFileDigest& expected, bool verify) {
  const std::string path = (fs::path(step_dir) / expected.file).string();
  FileDigest actual;
  if (verify) {
    absl::StatusOr<FileDigest> digest = DigestFile(path);
    if (absl::IsNotFound(digest.status())) {
      return absl::DataLossError(absl::StrCat(
          path, ": missing; the manifest records ", expected.bytes, " bytes"));
    }
    if (absl::IsInvalidArgument(digest.status())) {
      return absl::DataLossError(digest.status().message());
    }
    RETURN_IF_ERROR(digest.status());
    actual = *digest;
  } else {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) {
        return absl::DataLossError(
            absl::StrCat(path, ": missing; the manifest records ",
                         expected.bytes, " bytes"));
      }
      return ErrnoError(errno, path, "stat");
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::DataLossError(absl::StrCat(path, ": not a regular file"));
    }
    actual.bytes = static_cast<uint64_t>(st.st_size);
  }
  if (actual.bytes != expected.bytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", actual.bytes, " bytes, the manifest records ",
                     expected.bytes, " (truncated or overwritten)"));
  }
  if (verify && actual.crc32c != expected.crc32c) {
    return absl::DataLossError(absl::StrCat(
        path, ": CRC-32C ", Hex32(actual.crc32c), ", the manifest records ",
        Hex32(expected.crc32c), " (the file is corrupt)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ManifestToJson(const CheckpointManifest& m) {
  OrderedJson stages = OrderedJson::array();
  for (const StageFileDigest& d : m.stages) {
    OrderedJson s;
    s["stage"] = d.stage;
    s["file"] = d.file;
    s["bytes"] = d.bytes;
    s["crc32c"] = Hex32(d.crc32c);
    stages.push_back(std::move(s));
  }
  OrderedJson j;
  j["format"] = kManifestFormat;
  j["job"] = m.job;
  j["job_id"] = m.job_id;
  j["step"] = m.step;
  j["config_hash"] = m.config_hash;
  if (!m.training_hash.empty()) j["training_hash"] = m.training_hash;
  if (!m.job_yaml.empty()) j["job_yaml"] = m.job_yaml;
  j["num_stages"] = m.num_stages;
  j["stage_begin"] = m.stage_begin;
  j["stages"] = std::move(stages);
  j["created_unix_ms"] = m.created_unix_ms;
  return j.dump(2, ' ', /*ensure_ascii=*/false,
                OrderedJson::error_handler_t::replace) +
         "\n";
}

absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view json,
                                                 absl::string_view source) {
  if (json.size() > static_cast<size_t>(kMaxManifestBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", json.size(), " bytes, over the limit of ",
                     kMaxManifestBytes, " for a manifest"));
  }
  ASSIGN_OR_RETURN(Json parsed, ParseManifestText(json, source));
  try {
    return ParseManifestJson(parsed, source);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(source, ": out of memory reading the manifest"));
  } catch (const std::exception& e) {
    // The reads above check types first, so this is a bug, but the input is
    // untrusted and the boundary must not throw.
    return absl::InternalError(absl::StrCat(
        source, ": unexpected error reading the manifest: ", e.what()));
  }
}

absl::StatusOr<StageFileDigest> DigestStageFile(const std::string& step_dir,
                                                int stage) {
  StageFileDigest d;
  d.stage = stage;
  d.file = StageFileName(stage);
  ASSIGN_OR_RETURN(FileDigest digest,
                   DigestFile((fs::path(step_dir) / d.file).string()));
  d.bytes = digest.bytes;
  d.crc32c = digest.crc32c;
  return d;
}

absl::Status WriteManifest(const std::string& checkpoint_dir,
                           const CheckpointManifest& manifest) {
  const std::string step_dir = StepDirPath(checkpoint_dir, manifest.step);
  const std::string path = (fs::path(step_dir) / kManifestFileName).string();
  // A manifest that could not be read back would make the step look
  // corrupt forever; refuse it before anything reaches the disk.
  absl::StatusOr<CheckpointManifest> checked =
      ParseManifest(ManifestToJson(manifest), path);
  if (!checked.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to write an invalid manifest: ", checked.status().message()));
  }
  RETURN_IF_ERROR(
      CheckDirectory(step_dir, "step directory (the stage files come first)"));
  // The stages in order, whatever order the caller collected them in.
  return WriteFileAtomically(path, ManifestToJson(*checked));
}

absl::StatusOr<CheckpointManifest> LoadCompleteCheckpoint(
    const std::string& checkpoint_dir, int64_t step, bool verify_checksums) {
  const std::string step_dir = StepDirPath(checkpoint_dir, step);
  RETURN_IF_ERROR(CheckDirectory(step_dir, "step directory"));
  const std::string path = (fs::path(step_dir) / kManifestFileName).string();
  absl::StatusOr<std::string> text = ReadFile(path, kMaxManifestBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat(step_dir, ": step ", step, " is incomplete: no manifest"));
  }
  if (absl::IsInvalidArgument(text.status())) {  // Too large, not a file.
    return absl::DataLossError(text.status().message());
  }
  RETURN_IF_ERROR(text.status());
  absl::StatusOr<CheckpointManifest> manifest = ParseManifest(*text, path);
  if (absl::IsInvalidArgument(manifest.status())) {
    return absl::DataLossError(manifest.status().message());
  }
  RETURN_IF_ERROR(manifest.status());
  if (manifest->step != step) {
    return absl::DataLossError(absl::StrCat(path, ": step: ", manifest->step,
                                            ", but the directory is step-",
                                            step));
  }
  for (const StageFileDigest& d : manifest->stages) {
    RETURN_IF_ERROR(CheckStageFile(step_dir, d, verify_checksums));
  }
  return manifest;
}

}  // namespace conveyor::checkpoint
