#include "cli/export_tokenizer.h"

#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

// The checkpoint writer's files: a tokenizer path must not replace them.
constexpr const char* kCheckpointFiles[] = {"config.json", "model.safetensors",
                                            "model.safetensors.index.json"};

bool Exists(const fs::path& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

absl::Status CopyFile(const fs::path& from, const fs::path& to) {
  ASSIGN_OR_RETURN(const std::string bytes,
                   ReadFile(from.string(), kMaxTokenizerFileBytes));
  return WriteFileAtomically(to.string(), bytes);
}

bool HasTokenizer(const fs::path& dir) {
  return Exists(dir / "tokenizer.json") || Exists(dir / "tokenizer.model");
}

// path -> the name it is written under, for each file the paths give.
absl::StatusOr<std::map<std::string, fs::path>> FilesOf(
    const std::vector<std::string>& paths,
    std::map<std::string, bool>* from_file) {
  std::map<std::string, fs::path> files;
  auto add = [&](const std::string& name, const fs::path& path,
                 bool explicit_file) -> absl::Status {
    if (auto [it, inserted] = files.emplace(name, path); !inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokenizer: ", it->second.string(), " and ",
                       path.string(), " are both ", name));
    }
    (*from_file)[name] = explicit_file;
    return absl::OkStatus();
  };
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (ec || !fs::exists(status)) {
      return absl::NotFoundError(
          absl::StrCat("--tokenizer ", path, ": no such file or directory"));
    }
    if (fs::is_directory(status)) {
      if (!HasTokenizer(path)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tokenizer ", path,
                         ": the directory holds neither tokenizer.json nor "
                         "tokenizer.model"));
      }
      for (const char* name : kTokenizerFiles) {
        if (Exists(fs::path(path) / name)) {
          RETURN_IF_ERROR(add(name, fs::path(path) / name, false));
        }
      }
      continue;
    }
    if (!fs::is_regular_file(status)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer ", path, ": neither a directory nor a regular file"));
    }
    const std::string name = fs::path(path).filename().string();
    for (const char* own : kCheckpointFiles) {
      if (name == own) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tokenizer ", path, ": ", name,
                         " is the export's own file, not a tokenizer's"));
      }
    }
    RETURN_IF_ERROR(add(name, path, true));
  }
  return files;
}

}  // namespace

CopiedFiles CopyImportedTokenizerFiles(const std::string& source_dir,
                                       const std::string& out_dir) {
  CopiedFiles out;
  std::error_code ec;
  if (!fs::is_directory(source_dir, ec)) {
    out.warnings.push_back(absl::StrCat(
        "warning: the directory the model was imported from, ", source_dir,
        ", is gone: could not copy its tokenizer files (",
        absl::StrJoin(kTokenizerFiles, ", "),
        "); name them with --tokenizer PATH"));
    return out;
  }
  if (!HasTokenizer(source_dir)) {
    out.warnings.push_back(absl::StrCat(
        "warning: ", source_dir,
        ", which the model was imported from, holds neither tokenizer.json "
        "nor tokenizer.model: the export has no tokenizer; name one with "
        "--tokenizer PATH"));
  }
  for (const char* name : kTokenizerFiles) {
    const fs::path from = fs::path(source_dir) / name;
    if (!Exists(from) || Exists(fs::path(out_dir) / name)) continue;
    if (absl::Status s = CopyFile(from, fs::path(out_dir) / name); !s.ok()) {
      out.warnings.push_back(
          absl::StrCat("warning: could not copy ", name, ": ", s.message()));
      continue;
    }
    out.names.push_back(name);
  }
  return out;
}

absl::Status CheckTokenizerPaths(const std::vector<std::string>& paths) {
  std::map<std::string, bool> from_file;
  return FilesOf(paths, &from_file).status();
}

absl::StatusOr<std::vector<std::string>> CopyTokenizerPaths(
    const std::vector<std::string>& paths, const std::string& out_dir) {
  std::map<std::string, bool> from_file;
  ASSIGN_OR_RETURN(const auto files, FilesOf(paths, &from_file));
  std::vector<std::string> names;
  for (const auto& [name, path] : files) {
    const fs::path to = fs::path(out_dir) / name;
    if (!from_file[name] && Exists(to)) continue;
    RETURN_IF_ERROR(CopyFile(path, to));
    names.push_back(name);
  }
  return names;
}

}  // namespace conveyor::cli
