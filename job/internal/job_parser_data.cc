// JobParser's `data:` section (job/internal/job_parser.h): the source kinds
// and their keys (engine/data.h), the documents and blend sub-sections, and
// the checks against the model that need no file.
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"
#include "engine/data.h"
#include "job/internal/job_parser.h"

namespace conveyor::job::job_internal {

using engine::DataBlendEntry;
using engine::DataConfig;
using engine::DataKindName;
using engine::kMaxModelDimension;
using engine::ParseDataKind;
using engine::ParseTokenDType;
using engine::TokenDType;
using engine::TokenDTypeName;

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// data: every key any source takes, then the keys of each source, so that a
// key of another source is reported as misplaced rather than unknown.
constexpr absl::string_view kDataKeys[] = {
    "source", "seed",   "shuffle",    "path",      "blend", "seq_len",
    "dtype",  "uint16", "vocab_size", "documents", "noise", "num_samples"};
constexpr absl::string_view kSyntheticKeys[] = {"source", "seed", "shuffle",
                                                "noise", "num_samples"};
constexpr absl::string_view kTensorsKeys[] = {"source", "seed", "shuffle",
                                              "path"};
constexpr absl::string_view kTokensKeys[] = {
    "source", "seed",   "shuffle",    "path",     "seq_len",
    "dtype",  "uint16", "vocab_size", "documents"};
constexpr absl::string_view kLlmcKeys[] = {
    "source", "seed", "shuffle", "path", "seq_len", "vocab_size", "documents"};
constexpr absl::string_view kMegatronKeys[] = {
    "source", "seed",    "shuffle",    "path",
    "blend",  "seq_len", "vocab_size", "documents"};
constexpr absl::string_view kDocumentsKeys[] = {
    "eod_token", "reset_position_ids", "document_mask", "eod_mask_loss"};
constexpr absl::string_view kBlendKeys[] = {"path", "weight"};

// Ids a tokens file of `dtype` can hold.
int64_t TokenDTypeIds(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUint8:
      return int64_t{1} << 8;
    case TokenDType::kUint16:
      return int64_t{1} << 16;
    case TokenDType::kUint32:
      return int64_t{1} << 32;
    case TokenDType::kInt32:
      return int64_t{1} << 31;
  }
  return 0;
}

}  // namespace

absl::Status JobParser::ParseData(const YamlValue& value,
                                  DataConfig& data) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kDataKeys));
  ASSIGN_OR_RETURN(const YamlMapEntry* source, reader_.Require(map, "source"));
  ASSIGN_OR_RETURN(const std::string source_name,
                   reader_.ParseString(source->value));
  absl::StatusOr<DataConfig::Kind> kind = ParseDataKind(source_name);
  if (!kind.ok()) return reader_.Error(source->value, kind.status().message());
  data.kind = *kind;

  YamlNames keys;
  switch (data.kind) {
    case DataConfig::Kind::kSyntheticRegression:
      keys = kSyntheticKeys;
      break;
    case DataConfig::Kind::kTensors:
      keys = kTensorsKeys;
      break;
    case DataConfig::Kind::kTokens:
      keys = kTokensKeys;
      break;
    case DataConfig::Kind::kLlmc:
      keys = kLlmcKeys;
      break;
    case DataConfig::Kind::kMegatron:
      keys = kMegatronKeys;
      break;
  }
  RETURN_IF_ERROR(CheckKindKeys(
      map, keys, absl::StrCat("source ", DataKindName(data.kind))));

  if (const YamlMapEntry* e = map.Find("seed"); e != nullptr) {
    ASSIGN_OR_RETURN(data.seed, reader_.ParseUint64(e->value));
  }
  if (const YamlMapEntry* e = map.Find("shuffle"); e != nullptr) {
    ASSIGN_OR_RETURN(data.shuffle, reader_.ParseBool(e->value));
  }
  if (data.kind == DataConfig::Kind::kMegatron) {
    // One data set by its prefix, or a blend: exactly one of the two.
    const YamlMapEntry* path = map.Find("path");
    const YamlMapEntry* blend = map.Find("blend");
    if ((path == nullptr) == (blend == nullptr)) {
      return reader_.Error(
          path != nullptr ? path->value : map.self,
          "source megatron takes exactly one of 'path' (one data set's "
          "prefix, the PREFIX of PREFIX.bin and PREFIX.idx) and 'blend' "
          "(several, by weight)");
    }
    if (path != nullptr) {
      ASSIGN_OR_RETURN(const std::string p, reader_.ParseString(path->value));
      data.path = Resolve(base_dir_, p);
    } else {
      RETURN_IF_ERROR(ParseBlend(blend->value, data));
    }
  } else if (data.kind != DataConfig::Kind::kSyntheticRegression) {
    ASSIGN_OR_RETURN(const YamlMapEntry* path, reader_.Require(map, "path"));
    ASSIGN_OR_RETURN(const std::string p, reader_.ParseString(path->value));
    data.path = Resolve(base_dir_, p);
  }
  if (engine::IsTokenKind(data.kind)) {
    // Required although DataConfig would take it from the model (0): the
    // window length is the one thing a token file does not say by itself,
    // so the job states it and DataSource::Create checks it against the
    // model's input_shape.
    ASSIGN_OR_RETURN(const YamlMapEntry* seq_len,
                     reader_.Require(map, "seq_len"));
    ASSIGN_OR_RETURN(data.seq_len,
                     reader_.ParseInt(seq_len->value, 1, kMaxModelDimension));
  }
  int64_t max_vocab = kInt64Max;
  if (data.kind == DataConfig::Kind::kTokens) {
    const YamlMapEntry* dtype = map.Find("dtype");
    const YamlMapEntry* uint16 = map.Find("uint16");
    if (dtype != nullptr) {
      ASSIGN_OR_RETURN(const std::string name,
                       reader_.ParseString(dtype->value));
      absl::StatusOr<TokenDType> parsed = ParseTokenDType(name);
      if (!parsed.ok()) {
        return reader_.Error(dtype->value, parsed.status().message());
      }
      data.token_dtype = *parsed;
    }
    // `uint16: true` predates dtype and still means dtype uint16 (false:
    // bytes); given with dtype, the two must agree.
    if (uint16 != nullptr) {
      ASSIGN_OR_RETURN(const bool wide, reader_.ParseBool(uint16->value));
      const TokenDType alias = wide ? TokenDType::kUint16 : TokenDType::kUint8;
      if (dtype != nullptr && alias != data.token_dtype) {
        return reader_.Error(
            uint16->value,
            absl::StrCat("uint16: ", wide ? "true" : "false", " means dtype ",
                         TokenDTypeName(alias), ", but dtype is ",
                         TokenDTypeName(data.token_dtype),
                         "; give dtype alone"));
      }
      data.token_dtype = alias;
    }
    max_vocab = TokenDTypeIds(data.token_dtype);
  }
  if (const YamlMapEntry* e = map.Find("vocab_size"); e != nullptr) {
    absl::StatusOr<int64_t> vocab = reader_.ParseInt(e->value, 1, kInt64Max);
    if (vocab.ok() && *vocab > max_vocab) {
      return reader_.Error(
          e->value,
          absl::StrCat("must be at most ", max_vocab, " for dtype ",
                       TokenDTypeName(data.token_dtype), " tokens; got ",
                       *vocab,
                       data.token_dtype == TokenDType::kUint8
                           ? " (set dtype: uint16 or wider for vocabularies "
                             "above 256)"
                           : ""));
    }
    ASSIGN_OR_RETURN(data.vocab_size, std::move(vocab));
  }
  if (const YamlMapEntry* e = map.Find("documents"); e != nullptr) {
    RETURN_IF_ERROR(ParseDocuments(e->value, data));
    // The bounds known from the section alone; CheckDataFits adds the
    // model's vocabulary, Create the dtype of a llmc or megatron file.
    const int64_t eod = data.documents.eod_token;
    const int64_t bound = data.vocab_size > 0 ? data.vocab_size
                          : data.kind == DataConfig::Kind::kTokens ? max_vocab
                                                                   : 0;
    if (bound > 0 && eod >= bound) {
      const YamlMap documents = *reader_.ReadAnyMap(e->value);
      return reader_.Error(
          documents.Find("eod_token")->value,
          absl::StrCat(
              "must be below ",
              data.vocab_size > 0
                  ? absl::StrCat("data.vocab_size ", data.vocab_size)
                  : absl::StrCat(bound, " (what dtype ",
                                 TokenDTypeName(data.token_dtype), " holds)"),
              "; got ", eod));
    }
  }
  if (data.kind == DataConfig::Kind::kSyntheticRegression) {
    if (const YamlMapEntry* e = map.Find("noise"); e != nullptr) {
      ASSIGN_OR_RETURN(data.noise, reader_.ParseNonNegativeDouble(e->value));
    }
    if (const YamlMapEntry* e = map.Find("num_samples"); e != nullptr) {
      ASSIGN_OR_RETURN(data.num_samples,
                       reader_.ParseInt(e->value, 0, kInt64Max));
    }
  }
  return absl::OkStatus();
}

absl::Status JobParser::ParseDocuments(const YamlValue& value,
                                       DataConfig& data) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kDocumentsKeys));
  engine::DocumentsConfig& d = data.documents;
  if (const YamlMapEntry* e = map.Find("eod_token"); e != nullptr) {
    ASSIGN_OR_RETURN(d.eod_token, reader_.ParseInt(e->value, 0, kInt64Max));
  }
  if (const YamlMapEntry* e = map.Find("reset_position_ids"); e != nullptr) {
    ASSIGN_OR_RETURN(d.reset_position_ids, reader_.ParseBool(e->value));
  }
  if (const YamlMapEntry* e = map.Find("document_mask"); e != nullptr) {
    ASSIGN_OR_RETURN(d.document_mask, reader_.ParseBool(e->value));
  }
  if (const YamlMapEntry* e = map.Find("eod_mask_loss"); e != nullptr) {
    ASSIGN_OR_RETURN(d.eod_mask_loss, reader_.ParseBool(e->value));
  }
  // Only megatron has a document index to fall back on.
  if (d.enabled() && d.eod_token == -1 &&
      data.kind != DataConfig::Kind::kMegatron) {
    return reader_.Error(
        value, absl::StrCat("eod_token is required for source ",
                            DataKindName(data.kind),
                            ": its file has no document index, so documents "
                            "end at EOD tokens"));
  }
  return absl::OkStatus();
}

absl::Status JobParser::ParseBlend(const YamlValue& value,
                                   DataConfig& data) const {
  const YAML::Node& list = value.node;
  if (!list.IsSequence() || list.size() < 2 ||
      list.size() > static_cast<size_t>(engine::kMaxBlendEntries)) {
    return reader_.Error(
        value,
        absl::StrCat("must be a list of 2 to ", engine::kMaxBlendEntries,
                     " {path, weight} maps; got ",
                     list.IsSequence() ? absl::StrCat(list.size(), " items")
                                       : DescribeYaml(list),
                     list.IsSequence() && list.size() == 1
                         ? " (give one data set as data.path)"
                         : ""));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const YamlValue item = reader_.Element(value, i);
    ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(item, kBlendKeys));
    ASSIGN_OR_RETURN(const YamlMapEntry* path, reader_.Require(map, "path"));
    ASSIGN_OR_RETURN(const YamlMapEntry* weight,
                     reader_.Require(map, "weight"));
    DataBlendEntry entry;
    ASSIGN_OR_RETURN(const std::string p, reader_.ParseString(path->value));
    entry.path = Resolve(base_dir_, p);
    ASSIGN_OR_RETURN(entry.weight, reader_.ParsePositiveDouble(weight->value));
    data.blend.push_back(std::move(entry));
  }
  return absl::OkStatus();
}

absl::Status JobParser::CheckDataFits(
    const YamlValue& value, const DataConfig& data,
    const engine::SampleShapes& shapes) const {
  // The data must fit the model. The checks that need no file run here, so a
  // mismatch is reported at the data section rather than when training
  // starts.
  if (absl::Status fits = CheckDataShapes(data, shapes); !fits.ok()) {
    return reader_.Error(value, fits.message());
  }
  if (absl::Status fits = CheckDocuments(data, shapes); !fits.ok()) {
    // At the eod_token when there is one (the model's vocabulary is the one
    // thing ParseData could not check it against).
    absl::StatusOr<YamlMap> map = reader_.ReadAnyMap(value);
    const YamlMapEntry* documents = map.ok() ? map->Find("documents") : nullptr;
    if (documents == nullptr) return reader_.Error(value, fits.message());
    absl::StatusOr<YamlMap> d = reader_.ReadAnyMap(documents->value);
    const YamlMapEntry* eod = d.ok() ? d->Find("eod_token") : nullptr;
    return reader_.Error(eod != nullptr ? eod->value : documents->value,
                         fits.message());
  }
  return absl::OkStatus();
}

}  // namespace conveyor::job::job_internal
