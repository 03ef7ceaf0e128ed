#include "cli/staged_directory.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc 2.28+)
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <random>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

enum class Target {
  kAbsent,  // Nothing there: the staging directory is renamed to it.
  kEmpty,   // An empty directory: rename replaces it.
  kOutput,  // An earlier output, to be exchanged (overwrite only).
};

// Whether `outer` is `inner` or one of its ancestors, by their real paths.
bool Holds(const fs::path& outer, const std::string& inner) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(outer, ec);
  if (ec) return false;
  const fs::path b = fs::weakly_canonical(inner, ec);
  if (ec) return false;
  auto ai = a.begin();
  auto bi = b.begin();
  for (; ai != a.end(); ++ai, ++bi) {
    if (ai->empty()) continue;  // A trailing separator.
    if (bi == b.end() || *ai != *bi) return false;
  }
  return true;
}

// `shown`: the target as the user named it.
absl::StatusOr<Target> Classify(const fs::path& target,
                                const std::string& shown,
                                const StagedDirectoryOptions& o) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(target, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return ErrnoError(ec.value(), shown, "stat");
  }
  if (!fs::exists(status)) return Target::kAbsent;
  if (fs::is_symlink(status)) {
    return absl::FailedPreconditionError(absl::StrCat(
        shown,
        " is a symbolic link: name the directory it points to, so that what "
        "is replaced is plain"));
  }
  if (!fs::is_directory(status)) {
    return absl::FailedPreconditionError(absl::StrCat(
        shown, " exists and is not a directory: refusing to replace it with ",
        o.what));
  }
  for (const auto& [path, what] : o.keep) {
    if (Holds(target, path)) {
      return absl::FailedPreconditionError(
          absl::StrCat(shown, " is or holds ", what, " (", path,
                       "): refusing to write ", o.what, " there"));
    }
  }
  std::string other_kind;
  bool empty = true;
  for (fs::directory_iterator it(target, ec), end; !ec && it != end;
       it.increment(ec)) {
    empty = false;
    const std::string name = it->path().filename().string();
    std::error_code kind_ec;
    const bool plain_file =
        !it->is_symlink(kind_ec) && it->is_regular_file(kind_ec);
    if (!plain_file && other_kind.empty()) other_kind = name;
  }
  if (ec) return ErrnoError(ec.value(), shown, "read directory");
  if (empty) return Target::kEmpty;
  std::string marker;
  for (const std::string& m : o.markers) {
    if (fs::exists(fs::symlink_status(target / m, ec))) {
      marker = m;
      break;
    }
  }
  if (marker.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        shown, " is not empty and is not ", o.what, " (it holds none of ",
        absl::StrJoin(o.markers, ", "),
        "): refusing to write into it; name a new or empty directory"));
  }
  if (!o.overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat(shown, " already holds ", o.what, " (", marker, "); ",
                     o.overwrite_flag, " replaces it"));
  }
  if (!other_kind.empty()) {
    // A directory of an output holds files only; one with more (a git
    // clone, a folder of notes) is someone's, and is not deleted.
    return absl::FailedPreconditionError(absl::StrCat(
        shown, " holds ", o.what, " but also '", other_kind,
        "', which is not a plain file: refusing to replace it; remove it "
        "yourself or name another directory"));
  }
  return Target::kOutput;
}

absl::Status SyncDirectory(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, path, "open");
  const ScopedFd closer(fd);
  if (fsync(fd) != 0) return ErrnoError(errno, path, "fsync");
  return absl::OkStatus();
}

// The target as an absolute path without a trailing separator or dots.
absl::StatusOr<fs::path> TargetPath(const std::string& target) {
  std::error_code ec;
  fs::path path = fs::absolute(target, ec);
  if (ec) return ErrnoError(ec.value(), target, "absolute path");
  path = path.lexically_normal();
  if (path.has_relative_path() && path.filename().empty()) {
    path = path.parent_path();
  }
  if (!path.has_relative_path()) {
    return absl::InvalidArgumentError(
        absl::StrCat(target, ": not a directory an output can be moved to"));
  }
  return path;
}

}  // namespace

absl::StatusOr<StagedDirectory> StagedDirectory::Create(
    const std::string& target, StagedDirectoryOptions options) {
  ASSIGN_OR_RETURN(const fs::path path, TargetPath(target));
  RETURN_IF_ERROR(Classify(path, target, options).status());
  return StagedDirectory(path.string(), target, std::move(options));
}

absl::StatusOr<std::string> StagedDirectory::Stage() {
  if (!staging_.empty()) return staging_;
  const fs::path path(target_);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    return ErrnoError(ec.value(), path.parent_path().string(),
                      "create directory");
  }
  // Beside the target, so that the final rename stays on one filesystem;
  // hidden and named after it, so a leftover says what it was.
  std::random_device random;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const fs::path staging =
        path.parent_path() / absl::StrFormat(".%s.staging-%d-%08x",
                                             path.filename().string(), getpid(),
                                             random());
    if (fs::create_directory(staging, ec)) {
      staging_ = staging.string();
      return staging_;
    }
    if (ec) return ErrnoError(ec.value(), staging.string(), "mkdir");
  }
  return absl::AlreadyExistsError(
      absl::StrCat("no free name for a staging directory beside ", shown_));
}

StagedDirectory::StagedDirectory(StagedDirectory&& other) noexcept
    : target_(std::move(other.target_)),
      shown_(std::move(other.shown_)),
      staging_(std::exchange(other.staging_, std::string())),
      options_(std::move(other.options_)) {}

absl::Status StagedDirectory::Keep(const std::string& path,
                                   const std::string& what) {
  options_.keep.emplace_back(path, what);
  return Classify(target_, shown_, options_).status();
}

StagedDirectory::~StagedDirectory() {
  if (staging_.empty()) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);  // Best effort: a failed export's files.
}

absl::StatusOr<StagedDirectory::Committed> StagedDirectory::Commit() {
  if (staging_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(shown_, ": nothing was staged to commit"));
  }
  ASSIGN_OR_RETURN(const Target target, Classify(target_, shown_, options_));
  RETURN_IF_ERROR(SyncDirectory(staging_));
  const std::string parent = fs::path(target_).parent_path().string();
  Committed done;
  std::string old;  // Where the replaced output went.
  if (target != Target::kOutput) {
    // A rename onto an empty directory replaces it; onto one that gained
    // files since the check it fails, which leaves them alone.
    if (rename(staging_.c_str(), target_.c_str()) != 0) {
      return ErrnoError(errno, shown_, "rename the staged output to");
    }
  } else if (renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(),
                       RENAME_EXCHANGE) == 0) {
    old = staging_;  // The earlier output, now under the staging name.
    done.replaced = true;
  } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
    // A filesystem without the exchange: the earlier output stays whole
    // under another name until the new one is in place.
    const std::string aside = staging_ + ".old";
    if (rename(target_.c_str(), aside.c_str()) != 0) {
      return ErrnoError(errno, shown_, "rename aside");
    }
    if (rename(staging_.c_str(), target_.c_str()) != 0) {
      const absl::Status failed =
          ErrnoError(errno, shown_, "rename the staged output to");
      rename(aside.c_str(), target_.c_str());  // Put the old one back.
      return failed;
    }
    old = aside;
    done.replaced = true;
  } else {
    return ErrnoError(errno, shown_, "exchange with the staged output");
  }
  staging_.clear();
  const absl::Status synced = SyncDirectory(parent);
  if (!old.empty()) {
    std::error_code ec;
    fs::remove_all(old, ec);
    if (ec) {
      done.leftover = absl::StrCat("the replaced files are left in ", old, ": ",
                                   ec.message());
    }
  }
  RETURN_IF_ERROR(synced);
  return done;
}

}  // namespace conveyor::cli
