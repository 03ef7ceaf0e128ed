#include "cli/overrides.h"

#include <cstdint>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"

namespace conveyor::cli {
namespace {

constexpr int kMaxEmitDepth = 64;

absl::Status SpecError(const Override& o, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("--set ", o.spec, ": ", message));
}

// "model.layers" for the first `n` components of the path; "(top level)"
// for none.
std::string PathPrefix(const Override& o, size_t n) {
  if (n == 0) return "(top level)";
  return absl::StrJoin(o.path.begin(), o.path.begin() + n, ".");
}

// yaml-cpp marks quoted and block scalars with the non-specific tag "!" and
// plain ones with "?"; other tags were written explicitly ("!!str 3").
bool HasExplicitTag(const YAML::Node& node) {
  const std::string& tag = node.Tag();
  return !tag.empty() && tag != "?" && tag != "!";
}

// A limit crossed at `node`: "job.yaml:12:7: ..." when `source` names the
// text the node was parsed from, so the user finds the place as without
// --set; else the message alone.
absl::Status LimitError(const YAML::Node& node, absl::string_view source,
                        absl::string_view message) {
  const YAML::Mark mark = node.Mark();
  if (source.empty() || mark.is_null()) {
    return absl::InvalidArgumentError(message);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ":", mark.line + 1, ":", mark.column + 1, ": ", message));
}

absl::Status Emit(const YAML::Node& node, int depth, size_t max_bytes,
                  absl::string_view source, YAML::Emitter& out) {
  if (depth > kMaxEmitDepth) {
    return LimitError(node, source,
                      absl::StrCat("the job document nests deeper than ",
                                   kMaxEmitDepth, " levels"));
  }
  // Checked at every node, so an alias bomb stops at the limit instead of
  // after expanding in memory.
  if (out.size() > max_bytes) {
    return LimitError(node, source,
                      absl::StrCat("the job document exceeds ", max_bytes,
                                   " bytes once emitted"));
  }
  if (HasExplicitTag(node)) out << YAML::VerbatimTag(node.Tag());
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      out << YAML::Null;
      break;
    case YAML::NodeType::Scalar:
      // Without this the emitter writes "3" back plain, which turns the
      // string into a number.
      if (node.Tag() == "!") out << YAML::DoubleQuoted;
      out << node.Scalar();
      break;
    case YAML::NodeType::Sequence:
      if (node.Style() == YAML::EmitterStyle::Flow) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const YAML::Node& item : node) {
        RETURN_IF_ERROR(Emit(item, depth + 1, max_bytes, source, out));
      }
      out << YAML::EndSeq;
      break;
    case YAML::NodeType::Map:
      if (node.Style() == YAML::EmitterStyle::Flow) out << YAML::Flow;
      out << YAML::BeginMap;
      for (const auto& entry : node) {
        out << YAML::Key;
        RETURN_IF_ERROR(Emit(entry.first, depth + 1, max_bytes, source, out));
        out << YAML::Value;
        RETURN_IF_ERROR(Emit(entry.second, depth + 1, max_bytes, source, out));
      }
      out << YAML::EndMap;
      break;
  }
  if (!out.good()) {
    return absl::InternalError(
        absl::StrCat("emitting YAML: ", out.GetLastError()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Override> ParseOverride(absl::string_view spec) {
  Override o;
  o.spec = std::string(spec);
  const size_t eq = spec.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set needs key.path=value; got '", spec, "'"));
  }
  o.path = absl::StrSplit(spec.substr(0, eq), '.');
  for (const std::string& key : o.path) {
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--set needs key.path=value with non-empty keys; got '", spec, "'"));
    }
  }
  o.value = std::string(spec.substr(eq + 1));
  return o;
}

absl::Status ApplyOverride(const Override& o, YAML::Node& doc) {
  const std::string value_name = absl::StrCat("--set ", o.spec, " (value)");
  ASSIGN_OR_RETURN(YAML::Node value,
                   LoadYaml(o.value, value_name, YamlDocuments::kExactlyOne));
  return CatchYamlExceptions("--set", o.spec, [&]() -> absl::Status {
    if (!doc.IsDefined() || doc.IsNull()) doc = YAML::Node(YAML::NodeType::Map);
    // YAML::Node copies share the underlying node, and operator= assigns
    // through to it; reset() rebinds a handle, which is how we walk.
    YAML::Node parent;
    parent.reset(doc);
    for (size_t i = 0; i < o.path.size(); ++i) {
      const std::string& key = o.path[i];
      const bool last = i + 1 == o.path.size();
      if (parent.IsSequence()) {
        uint64_t index = 0;
        if (!absl::SimpleAtoi(key, &index) || index >= parent.size()) {
          return SpecError(
              o, absl::StrCat(PathPrefix(o, i), " is a list of ", parent.size(),
                              " item(s); '", key, "' is not an index in [0, ",
                              parent.size(), ")"));
        }
        if (last) {
          parent[index] = value;
          return absl::OkStatus();
        }
        YAML::Node child = parent[index];
        parent.reset(child);
        continue;
      }
      if (!parent.IsDefined() || parent.IsNull()) {
        // An empty document, or `key:` with nothing after it.
        parent = YAML::Node(YAML::NodeType::Map);
      }
      if (!parent.IsMap()) {
        return SpecError(o, absl::StrCat(PathPrefix(o, i), " is ",
                                         DescribeYaml(parent), ", not a map"));
      }
      if (last) {
        parent[key] = value;
        return absl::OkStatus();
      }
      YAML::Node child = parent[key];
      parent.reset(child);
    }
    return absl::OkStatus();  // Unreachable: ParseOverride gives a path.
  });
}

absl::StatusOr<std::string> EmitYaml(const YAML::Node& doc, size_t max_bytes,
                                     absl::string_view source) {
  return CatchYamlExceptions(
      "--set", "the job", [&]() -> absl::StatusOr<std::string> {
        YAML::Emitter out;
        RETURN_IF_ERROR(Emit(doc, 0, max_bytes, source, out));
        if (out.size() > max_bytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the job document exceeds ", max_bytes, " bytes once emitted"));
        }
        return absl::StrCat(out.c_str(), "\n");
      });
}

absl::StatusOr<std::string> ApplyOverrides(absl::string_view yaml,
                                           absl::string_view file_name,
                                           absl::Span<const std::string> specs,
                                           size_t max_bytes,
                                           const DeriveOverrides& derive) {
  if (specs.empty() && derive == nullptr) return std::string(yaml);
  std::vector<std::string> all(specs.begin(), specs.end());
  std::vector<Override> overrides;
  for (const std::string& spec : specs) {
    ASSIGN_OR_RETURN(Override o, ParseOverride(spec));
    overrides.push_back(std::move(o));
  }
  ASSIGN_OR_RETURN(YAML::Node doc,
                   LoadYaml(yaml, file_name, YamlDocuments::kExactlyOne));
  if (doc.IsDefined() && !doc.IsNull() && !doc.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": --set needs a job that is a map; got ",
                     DescribeYaml(doc)));
  }
  // The file alone first: a limit it crosses on its own is reported at its
  // place in the file, as without --set. What the overrides add is checked
  // on the result, where only the flags can be blamed.
  RETURN_IF_ERROR(EmitYaml(doc, max_bytes, file_name).status());
  for (const Override& o : overrides) {
    RETURN_IF_ERROR(ApplyOverride(o, doc));
  }
  if (derive != nullptr) {
    for (const std::string& spec : derive(doc)) {
      ASSIGN_OR_RETURN(const Override o, ParseOverride(spec));
      RETURN_IF_ERROR(ApplyOverride(o, doc));
      all.push_back(spec);
    }
  }
  absl::StatusOr<std::string> emitted = EmitYaml(doc, max_bytes);
  if (!emitted.ok()) {
    return absl::Status(
        emitted.status().code(),
        absl::StrCat(file_name, " with --set ", absl::StrJoin(all, " --set "),
                     ": ", emitted.status().message()));
  }
  return emitted;
}

}  // namespace conveyor::cli
