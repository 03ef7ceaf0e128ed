#include "cli/checkpoint_job.h"

#include <algorithm>
#include <cstddef>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "cli/job_file.h"
#include "common/status_macros.h"
#include "common/yaml_path.h"
#include "common/yaml_reader.h"
#include "hf/checkpoint.h"
#include "hf/model.h"
#include "job/config_diff.h"
#include "job/config_hash.h"
#include "nlohmann/json.hpp"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

// Keys of the model section that do not make the model: how its first
// weights were drawn, whether activations are recomputed, what it was
// trained to minimise. (The stage boundaries are left out by
// ConfigScope::kTraining.)
constexpr const char* kTrainingOnlyModelKeys[] = {"init", "remat", "loss"};

// The path's components without a trailing empty one ("a/b/" -> a, b).
std::vector<std::string> Components(const fs::path& path) {
  std::vector<std::string> out;
  for (const fs::path& part : path) {
    if (!part.empty()) out.push_back(part.string());
  }
  return out;
}

std::string Normal(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  return (ec ? fs::path(path) : absolute).lexically_normal().string();
}

// The model section of `doc`, a copy (null when there is none).
YAML::Node ModelOf(const YAML::Node& doc) {
  if (!doc.IsMap()) return YAML::Node();
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it->first.IsScalar() && it->first.Scalar() == "model") {
      return YAML::Clone(it->second);
    }
  }
  return YAML::Node();
}

void RemoveKey(YAML::Node& map, const char* key) {
  if (map.IsMap()) map.remove(key);
}

// Whether two imports are the same model for this purpose: the same
// directory, or config.json files that parse equal. An import whose
// directory is gone cannot be told apart and passes (the tensors are still
// checked).
bool SameImport(const std::optional<std::string>& recorded,
                const std::string& given) {
  std::error_code ec;
  if (!recorded.has_value() ||
      !fs::exists(fs::path(*recorded) / hf::kHfConfigFile, ec)) {
    return true;
  }
  if (fs::equivalent(*recorded, given, ec) && !ec) return true;
  absl::StatusOr<hf::HfLlamaConfig> a = hf::ReadHfLlamaConfig(*recorded);
  absl::StatusOr<hf::HfLlamaConfig> b = hf::ReadHfLlamaConfig(given);
  return a.ok() && b.ok() && *a == *b;
}

struct ModelComparison {
  // In what makes the model: the imports, when they are other models (a
  // clause of its own, since the diff would shorten long paths), and the
  // model sections' keys.
  std::string import;
  job::ConfigDiff model;
  // Everywhere, for the note on what was let through.
  std::vector<std::string> elsewhere;
};

// The differences between the recorded job (`recorded_yaml`) and `given`
// in what makes the model. `recorded_dir` resolves the recorded job's
// from_hf.
absl::StatusOr<ModelComparison> CompareModels(
    absl::string_view recorded_yaml, const RecordedJobDir& recorded_dir,
    const job::ParsedJob& given) {
  ASSIGN_OR_RETURN(const YAML::Node old_doc,
                   LoadYaml(recorded_yaml, "the checkpoint's job",
                            YamlDocuments::kExactlyOne));
  ASSIGN_OR_RETURN(
      const YAML::Node new_doc,
      LoadYaml(given.yaml, given.file_name, YamlDocuments::kExactlyOne));
  try {
    ModelComparison out;
    YAML::Node old_model = ModelOf(old_doc);
    YAML::Node new_model = ModelOf(new_doc);
    for (const char* key : kTrainingOnlyModelKeys) {
      RemoveKey(old_model, key);
      RemoveKey(new_model, key);
    }
    // A token model's input_shape is its training sequence length, which
    // changes no parameter (learned positions are the embedding's
    // max_positions, compared with the layers). For a float input it is
    // the first layer's width, and stays compared.
    if (given.spec.model.token_input) {
      RemoveKey(old_model, "input_shape");
      RemoveKey(new_model, "input_shape");
    }
    const std::optional<std::string> old_hf =
        YamlScalarAt(old_doc, {"model", "from_hf"});
    const std::string& new_hf = given.spec.model.from_hf;
    if (old_hf.has_value() && !new_hf.empty()) {
      const std::optional<std::string> resolved =
          ResolveRecordedPath(recorded_dir, *old_hf);
      if (!SameImport(resolved, new_hf)) {
        // Named as the directories they are, which two relative paths
        // written in different files are not.
        out.import = absl::StrCat(
            "model.from_hf names another model (", resolved.value_or(*old_hf),
            " in the checkpoint, ", Normal(new_hf),
            " in this job: their config.json files differ)");
      }
      RemoveKey(old_model, "from_hf");
      RemoveKey(new_model, "from_hf");
    }
    YAML::Node old_cut(YAML::NodeType::Map);
    YAML::Node new_cut(YAML::NodeType::Map);
    old_cut["model"] = old_model;
    new_cut["model"] = new_model;
    ASSIGN_OR_RETURN(
        out.model,
        job::DiffJobDocuments(old_cut, new_cut, job::ConfigScope::kTraining));
    ASSIGN_OR_RETURN(
        const job::ConfigDiff all,
        job::DiffJobDocuments(old_doc, new_doc, job::ConfigScope::kConfig));
    for (const job::ConfigDifference& d : all.differences) {
      if (d.path != "model" && !d.path.starts_with("model.")) {
        out.elsewhere.push_back(d.path);
      }
    }
    return out;
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("comparing the models of two jobs: ", e.what()));
  }
}

bool SameModel(const ModelComparison& c) {
  return c.import.empty() && c.model.empty();
}

std::string DescribeModelDifference(const ModelComparison& c) {
  std::vector<std::string> parts;
  if (!c.import.empty()) parts.push_back(c.import);
  if (!c.model.empty()) parts.push_back(job::DescribeConfigDiff(c.model));
  return absl::StrJoin(parts, "; ");
}

// The recorded job's text, if it is the one the manifest's hashes were
// taken of: a damaged or edited one is not trusted to say what the model is.
std::optional<std::string> TrustedRecordedJob(
    const checkpoint::CheckpointManifest& m) {
  if (m.job_yaml.empty()) return std::nullopt;
  const job::JobHashes hashes = job::HashJobText(m.job_yaml);
  if (hashes.config != m.config_hash ||
      (!m.training_hash.empty() && hashes.training != m.training_hash)) {
    return std::nullopt;
  }
  return m.job_yaml;
}

std::string ManifestPath(const std::string& dir, int64_t step) {
  return (fs::path(checkpoint::StepDirPath(dir, step)) / "manifest.json")
      .string();
}

// --set model.from_hf=DIR: the text is YAML, and a JSON string is a YAML
// double-quoted one, whatever the path holds.
std::string FromHfOverride(const std::string& path) {
  return absl::StrCat("model.from_hf=", nlohmann::json(path).dump());
}

absl::StatusOr<CheckpointJob> RecordedJob(const CheckpointParams& params,
                                          const std::string& dir,
                                          const std::string& recorded,
                                          const CheckpointJobOptions& o) {
  const checkpoint::CheckpointManifest& m = params.manifest;
  CheckpointJob out;
  const std::string manifest = ManifestPath(dir, m.step);
  out.name = absl::StrCat("the job recorded in ", manifest);
  ASSIGN_OR_RETURN(const YAML::Node doc,
                   LoadYaml(recorded, manifest, YamlDocuments::kExactlyOne));
  const RecordedJobDir job_dir = InferRecordedJobDir(doc, dir);
  // The parse reads model.from_hf's config.json, so it must name a
  // directory here; the job's other paths (data, init, checkpoint) are not
  // used and may stay relative.
  absl::Status unresolved = absl::OkStatus();
  DeriveOverrides derive = [&](const YAML::Node& d) {
    std::vector<std::string> specs;
    const std::optional<std::string> from_hf =
        YamlScalarAt(d, {"model", "from_hf"});
    if (!from_hf.has_value() || fs::path(*from_hf).is_absolute()) {
      return specs;
    }
    const std::optional<std::string> resolved =
        ResolveRecordedPath(job_dir, *from_hf);
    if (!resolved.has_value()) {
      unresolved = absl::FailedPreconditionError(absl::StrCat(
          out.name, " imports model.from_hf '", *from_hf,
          "', a path relative to its job file's directory, which cannot be "
          "told from where the checkpoint is (",
          dir,
          ", by checkpoint.dir): give the job file with --job JOB.yaml, or "
          "the directory's absolute path with --set model.from_hf=DIR"));
      return specs;
    }
    specs.push_back(FromHfOverride(*resolved));
    return specs;
  };
  ASSIGN_OR_RETURN(
      const JobSource source,
      // Positions are in the job's text, which the manifest holds as a
      // string: the name says so.
      JobSourceFromText(
          recorded, absl::StrCat(manifest, " job_yaml"),
          job_dir.known && job_dir.depth == 0 ? job_dir.ancestor : "",
          o.overrides,
          // Without an import and overrides the text parses as recorded.
          o.overrides.empty() &&
                  !YamlScalarAt(doc, {"model", "from_hf"}).has_value()
              ? DeriveOverrides()
              : derive));
  RETURN_IF_ERROR(unresolved);
  absl::StatusOr<job::ParsedJob> parsed = ParseJobSource(source);
  if (!parsed.ok()) {
    return absl::Status(
        parsed.status().code(),
        absl::StrCat(parsed.status().message(),
                     YamlScalarAt(doc, {"model", "from_hf"}).has_value()
                         ? " (if the directory the model was imported from "
                           "moved, name it with --set model.from_hf=DIR)"
                         : ""));
  }
  out.parsed = *std::move(parsed);
  if (!o.overrides.empty()) {
    ASSIGN_OR_RETURN(const ModelComparison cmp,
                     CompareModels(recorded, job_dir, out.parsed));
    if (!SameModel(cmp)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--set changes the model of ", out.name, ", which wrote ", dir,
          " step-", m.step, ": ", DescribeModelDifference(cmp)));
    }
  }
  return out;
}

absl::StatusOr<CheckpointJob> GivenJob(
    const CheckpointParams& params, const std::string& dir,
    const std::optional<std::string>& recorded, const CheckpointJobOptions& o) {
  const checkpoint::CheckpointManifest& m = params.manifest;
  CheckpointJob out;
  out.name = o.job_file;
  ASSIGN_OR_RETURN(const JobSource source,
                   ReadJobSource(o.job_file, o.overrides));
  ASSIGN_OR_RETURN(out.parsed, ParseJobSource(source));
  // The same job (or the same training on another pipeline layout), or a
  // checkpoint from before hashes were recorded.
  if (m.config_hash.empty() || m.config_hash == out.parsed.config_hash ||
      (!m.training_hash.empty() &&
       m.training_hash == out.parsed.training_hash)) {
    return out;
  }
  const std::string written =
      absl::StrCat(out.name, " is not the job that wrote this checkpoint (",
                   dir, " step-", m.step, ")");
  if (!recorded.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        written, ": its configuration hash is ", out.parsed.config_hash,
        ", the checkpoint's ", m.config_hash,
        m.job_yaml.empty()
            ? absl::StrCat("; the checkpoint records no job file to compare "
                           "models with (it predates them, or the file was "
                           "over ",
                           checkpoint::kMaxRecordedJobBytes / 1024, " KiB)")
            : std::string("; the job file the checkpoint records does not "
                          "match its hashes, so its model is not known")));
  }
  ASSIGN_OR_RETURN(const YAML::Node doc,
                   LoadYaml(*recorded, ManifestPath(dir, m.step),
                            YamlDocuments::kExactlyOne));
  ASSIGN_OR_RETURN(
      const ModelComparison cmp,
      CompareModels(*recorded, InferRecordedJobDir(doc, dir), out.parsed));
  if (!SameModel(cmp)) {
    return absl::FailedPreconditionError(absl::StrCat(
        written, ": its model differs: ", DescribeModelDifference(cmp),
        "; leave out --job to use the job the checkpoint "
        "records"));
  }
  if (!cmp.elsewhere.empty()) {
    constexpr size_t kMaxListed = 4;
    std::vector<std::string> listed(
        cmp.elsewhere.begin(),
        cmp.elsewhere.begin() + static_cast<std::ptrdiff_t>(std::min(
                                    kMaxListed, cmp.elsewhere.size())));
    if (cmp.elsewhere.size() > kMaxListed) {
      listed.push_back(
          absl::StrCat("and ", cmp.elsewhere.size() - kMaxListed, " more"));
    }
    out.notes.push_back(absl::StrCat(
        "note: ", out.name,
        " differs from the job that wrote the checkpoint only outside its "
        "model (",
        absl::StrJoin(listed, ", "), ")"));
  }
  return out;
}

}  // namespace

RecordedJobDir InferRecordedJobDir(const YAML::Node& recorded_doc,
                                   const std::string& checkpoint_dir) {
  RecordedJobDir out;
  const std::optional<std::string> written =
      YamlScalarAt(recorded_doc, {"checkpoint", "dir"});
  if (!written.has_value() || written->empty() ||
      fs::path(*written).is_absolute()) {
    return out;
  }
  int up = 0;
  std::vector<std::string> down;
  for (const std::string& part :
       Components(fs::path(*written).lexically_normal())) {
    if (part == "..") {
      ++up;
    } else if (part != ".") {
      down.push_back(part);
    }
  }
  std::vector<std::string> here = Components(Normal(checkpoint_dir));
  if (down.size() >= here.size()) return out;
  for (size_t i = 0; i < down.size(); ++i) {
    if (here[here.size() - down.size() + i] != down[i]) return out;
  }
  fs::path ancestor;
  for (size_t i = 0; i + down.size() < here.size(); ++i) ancestor /= here[i];
  out.known = true;
  out.ancestor = ancestor.string();
  out.depth = up;
  return out;
}

std::optional<std::string> ResolveRecordedPath(const RecordedJobDir& dir,
                                               const std::string& path) {
  if (fs::path(path).is_absolute()) {
    return fs::path(path).lexically_normal().string();
  }
  if (!dir.known) return std::nullopt;
  std::vector<std::string> parts =
      Components(fs::path(path).lexically_normal());
  int up = 0;
  while (up < static_cast<int>(parts.size()) && parts[up] == "..") ++up;
  if (up < dir.depth) return std::nullopt;
  fs::path out = dir.ancestor;
  for (int i = dir.depth; i < up; ++i) out /= "..";
  for (size_t i = up; i < parts.size(); ++i) {
    if (parts[i] != ".") out /= parts[i];
  }
  return out.lexically_normal().string();
}

absl::StatusOr<CheckpointJob> ResolveCheckpointJob(
    const CheckpointParams& params, const std::string& dir,
    const CheckpointJobOptions& options) {
  const std::optional<std::string> recorded =
      TrustedRecordedJob(params.manifest);
  CheckpointJob job;
  if (!options.job_file.empty()) {
    ASSIGN_OR_RETURN(job, GivenJob(params, dir, recorded, options));
  } else if (recorded.has_value()) {
    ASSIGN_OR_RETURN(job, RecordedJob(params, dir, *recorded, options));
  } else if (params.manifest.job_yaml.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, " step-", params.manifest.step,
        " does not record the job that wrote it (its manifest predates "
        "recorded job files, or the file was over ",
        checkpoint::kMaxRecordedJobBytes / 1024,
        " KiB): give the job file with --job JOB.yaml"));
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job file recorded in ", ManifestPath(dir, params.manifest.step),
        " does not match the manifest's configuration hashes, so it is not "
        "trusted to say what the model is: give the job file with --job "
        "JOB.yaml"));
  }
  RETURN_IF_ERROR(
      CheckParamsMatchModel(params, dir, job.parsed.spec.model, job.name));
  return job;
}

}  // namespace conveyor::cli
