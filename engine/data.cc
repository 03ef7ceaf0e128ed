// DataSource (engine/data.h): the data kinds' names, the checks every kind
// shares (fields that do not apply, shapes against the model), and the
// dispatch to each kind's factory (engine/internal/data_sources.h).
#include "engine/data.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/internal/data_sources.h"
#include "engine/tensor.h"

namespace conveyor::engine {
namespace {

// Rejects fields given to a kind they do not apply to.
absl::Status CheckUnusedFields(const DataConfig& config) {
  const DataConfig defaults;
  const absl::string_view kind = DataKindName(config.kind);
  auto unused = [&](absl::string_view field) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.", field, " does not apply to data.source ", kind));
  };
  if (config.kind == DataConfig::Kind::kSyntheticRegression) {
    if (!config.path.empty()) return unused("path");
  } else {
    if (config.num_samples != defaults.num_samples) {
      return unused("num_samples");
    }
    if (config.noise != defaults.noise) return unused("noise");
  }
  if (!IsTokenKind(config.kind)) {
    if (config.seq_len != defaults.seq_len) return unused("seq_len");
    if (config.vocab_size != defaults.vocab_size) return unused("vocab_size");
    const DocumentsConfig& d = config.documents;
    if (d.enabled() || d.eod_token != -1) return unused("documents");
  }
  if (config.kind != DataConfig::Kind::kTokens &&
      config.token_dtype != defaults.token_dtype) {
    return unused("dtype");
  }
  if (config.kind != DataConfig::Kind::kMegatron && !config.blend.empty()) {
    return unused("blend");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsTokenKind(DataConfig::Kind kind) {
  return kind == DataConfig::Kind::kTokens || kind == DataConfig::Kind::kLlmc ||
         kind == DataConfig::Kind::kMegatron;
}

absl::StatusOr<DataConfig::Kind> ParseDataKind(absl::string_view name) {
  if (name == "synthetic-regression") {
    return DataConfig::Kind::kSyntheticRegression;
  }
  if (name == "tensors") return DataConfig::Kind::kTensors;
  if (name == "tokens") return DataConfig::Kind::kTokens;
  if (name == "llmc") return DataConfig::Kind::kLlmc;
  if (name == "megatron") return DataConfig::Kind::kMegatron;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown data source '", name,
      "'; allowed: synthetic-regression, tensors, tokens, llmc, megatron"));
}

absl::string_view DataKindName(DataConfig::Kind kind) {
  switch (kind) {
    case DataConfig::Kind::kSyntheticRegression:
      return "synthetic-regression";
    case DataConfig::Kind::kTensors:
      return "tensors";
    case DataConfig::Kind::kTokens:
      return "tokens";
    case DataConfig::Kind::kLlmc:
      return "llmc";
    case DataConfig::Kind::kMegatron:
      return "megatron";
  }
  return "unknown";
}

absl::StatusOr<TokenDType> ParseTokenDType(absl::string_view name) {
  for (TokenDType dtype : {TokenDType::kUint8, TokenDType::kUint16,
                           TokenDType::kUint32, TokenDType::kInt32}) {
    if (TokenDTypeName(dtype) == name) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown token dtype '", name,
                   "'; allowed: uint8, uint16, uint32, int32"));
}

absl::string_view TokenDTypeName(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUint8:
      return "uint8";
    case TokenDType::kUint16:
      return "uint16";
    case TokenDType::kUint32:
      return "uint32";
    case TokenDType::kInt32:
      return "int32";
  }
  return "unknown";
}

absl::Status CheckDataShapes(const DataConfig& config,
                             const SampleShapes& shapes) {
  switch (config.kind) {
    case DataConfig::Kind::kSyntheticRegression: {
      // Inputs [..., in] and targets [..., out] with the same leading
      // dimensions: y = x W + b along the last dimension.
      const bool same_leading =
          !shapes.input.empty() &&
          shapes.input.size() == shapes.target.size() &&
          std::equal(shapes.input.begin(), shapes.input.end() - 1,
                     shapes.target.begin());
      if (shapes.token_input || shapes.integer_targets || !same_leading) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.source synthetic-regression needs float inputs [..., in] and "
            "float targets [..., out] (loss: mse) with the same leading "
            "dimensions, but the model's input is ",
            shapes.token_input ? "token ids " : "", ShapeString(shapes.input),
            " and its target ", shapes.integer_targets ? "integer ids " : "",
            ShapeString(shapes.target)));
      }
      if (shapes.input.back() <= 0 || shapes.target.back() <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.source synthetic-regression needs positive "
                         "feature counts, got "
                         "input ",
                         ShapeString(shapes.input), " and target ",
                         ShapeString(shapes.target)));
      }
      return absl::OkStatus();
    }
    case DataConfig::Kind::kTensors:
      // x and y are checked against the model when the file is read.
      return absl::OkStatus();
    case DataConfig::Kind::kTokens:
    case DataConfig::Kind::kLlmc:
    case DataConfig::Kind::kMegatron: {
      const absl::string_view kind = DataKindName(config.kind);
      if (!shapes.token_input || shapes.input.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.source ", kind,
            " needs a model with token-id input [seq_len] (an embedding "
            "first), but the model's input is ",
            shapes.token_input ? "token ids " : "floats ",
            ShapeString(shapes.input)));
      }
      if (config.seq_len < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.seq_len must be positive (or 0 for the model's "
                         "input_shape[0]), "
                         "got ",
                         config.seq_len));
      }
      const int64_t seq_len =
          config.seq_len == 0 ? shapes.input[0] : config.seq_len;
      if (seq_len != shapes.input[0]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.seq_len is ", seq_len, " but the model's input_shape[0] is ",
            shapes.input[0]));
      }
      if (seq_len <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.seq_len must be positive, got ", seq_len));
      }
      if (!shapes.integer_targets || shapes.target != std::vector{seq_len}) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.source ", kind, " gives integer targets [", seq_len,
            "] (loss: cross_entropy), but the model's target is ",
            shapes.integer_targets ? "integer ids " : "floats ",
            ShapeString(shapes.target)));
      }
      // Checked now: an id the model has no row for would otherwise fail
      // the job at its first use, hours in.
      if (shapes.vocab > 0 && config.vocab_size > shapes.vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.vocab_size is ", config.vocab_size,
            " but the model's vocabulary is ", shapes.vocab,
            " (its embedding's vocab_size and its output's classes): ids "
            "from ",
            shapes.vocab, " up would fail the job when first met"));
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("data.source: unknown source");
}

absl::Status CheckDocuments(const DataConfig& config,
                            const SampleShapes& shapes) {
  const DocumentsConfig& d = config.documents;
  const absl::string_view kind = DataKindName(config.kind);
  if (!IsTokenKind(config.kind)) {
    if (d.enabled() || d.eod_token != -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.documents does not apply to data.source ", kind,
                       ": it has no token stream to find documents in"));
    }
    return absl::OkStatus();
  }
  if (d.eod_token < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.documents.eod_token must be a token id, got ", d.eod_token));
  }
  // The bound a file-free check knows: data.vocab_size, else the model's.
  const bool from_config = config.vocab_size > 0;
  const int64_t vocab = from_config ? config.vocab_size : shapes.vocab;
  if (d.eod_token >= 0 && vocab > 0 && d.eod_token >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.documents.eod_token ", d.eod_token, " is outside ",
        from_config ? "data.vocab_size " : "the model's vocabulary ", vocab));
  }
  if (d.enabled() && d.eod_token == -1 &&
      config.kind != DataConfig::Kind::kMegatron) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.documents.eod_token is required for data.source ", kind,
        ": its file has no document index, so documents end at EOD tokens"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DocumentLayout> DataSource::Documents(int64_t /*step*/,
                                                     int /*microbatch*/,
                                                     int /*num_microbatches*/,
                                                     int64_t /*batch_size*/) {
  return DocumentLayout{};
}

absl::Status DataSource::Check(const DataConfig& config,
                               const SampleShapes& shapes) {
  if (config.kind == DataConfig::Kind::kSyntheticRegression) {
    RETURN_IF_ERROR(CheckUnusedFields(config));
    RETURN_IF_ERROR(CheckDataShapes(config, shapes));
    return data_internal::CheckSyntheticRegression(config, shapes);
  }
  // The file sources' checks are their reads.
  return Create(config, shapes).status();
}

absl::StatusOr<std::unique_ptr<DataSource>> DataSource::Create(
    const DataConfig& config, const SampleShapes& shapes) {
  RETURN_IF_ERROR(CheckUnusedFields(config));
  RETURN_IF_ERROR(CheckDataShapes(config, shapes));
  RETURN_IF_ERROR(CheckDocuments(config, shapes));
  switch (config.kind) {
    case DataConfig::Kind::kSyntheticRegression:
      return data_internal::CreateSyntheticRegression(config, shapes);
    case DataConfig::Kind::kTensors:
      return data_internal::CreateTensors(config, shapes);
    case DataConfig::Kind::kTokens:
      return data_internal::CreateTokens(config, shapes);
    case DataConfig::Kind::kLlmc:
      return data_internal::CreateLlmc(config, shapes);
    case DataConfig::Kind::kMegatron:
      return data_internal::CreateMegatron(config, shapes);
  }
  return absl::InvalidArgumentError("data.source: unknown source");
}

}  // namespace conveyor::engine
