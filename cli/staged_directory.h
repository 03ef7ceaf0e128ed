// StagedDirectory: an output directory written beside its place and moved
// there whole, so that nobody (a reader, a crash, a failed write) ever sees
// a half-written one: `conveyorctl export --format hf` builds its checkpoint
// in a hidden sibling, then renames it into place, or, with overwrite,
// atomically exchanges it with the earlier output (renameat2
// RENAME_EXCHANGE; on a filesystem without it, two renames with the old
// one kept aside until the new one is in place) and then deletes the old.
//
//   ASSIGN_OR_RETURN(StagedDirectory out,     // Checks; creates nothing.
//                    StagedDirectory::Create(path, {.overwrite = true, ...}));
//   ... the slow work that may still fail ...
//   ASSIGN_OR_RETURN(const std::string staging, out.Stage());
//   ... write files into `staging` ...
//   ASSIGN_OR_RETURN(StagedDirectory::Committed done, out.Commit());
//
// What may be at the target, checked by Create and again by Commit:
//   nothing, or an empty directory: the output goes there;
//   a directory holding one of `markers` (a previous output): refused
//     (AlreadyExists) unless `overwrite`, then replaced;
//   a non-empty directory holding none of them: refused
//     (FailedPrecondition), even with overwrite: it is not an output of this
//     command, and replacing it would delete someone's files;
//   anything else (a file, a FIFO, a symbolic link): refused
//     (FailedPrecondition);
//   a directory that is or holds one of `keep` (the checkpoint being
//     exported, the model it was imported from): refused
//     (FailedPrecondition).
// The staging directory is removed when the object goes uncommitted. A crash
// can leave a hidden ".<name>.staging-*" sibling behind, never a partial
// target.
// Thread-compatible; concurrent writers of one target are not supported
// (the second commit fails or replaces the first, whole).
#ifndef CONVEYOR_CLI_STAGED_DIRECTORY_H_
#define CONVEYOR_CLI_STAGED_DIRECTORY_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor::cli {

struct StagedDirectoryOptions {
  bool overwrite = false;
  // Names whose presence marks a directory as an earlier output.
  std::vector<std::string> markers;
  // Paths the target must neither be nor contain, with what they are
  // ("the checkpoint being exported").
  std::vector<std::pair<std::string, std::string>> keep;
  // What the output is called in messages ("an HF checkpoint") and the
  // flag that allows replacing one ("--overwrite").
  std::string what = "an output";
  std::string overwrite_flag = "--overwrite";
};

class StagedDirectory {
 public:
  struct Committed {
    bool replaced = false;  // An earlier output was replaced.
    // Why the earlier output's files could not all be removed (they are
    // left in a hidden sibling); empty when they were.
    std::string leftover;
  };

  // Checks the target as above; creates nothing, so a command that fails
  // later leaves no trace. Errors as listed above, InvalidArgument for a
  // target that names no directory ("/"), or the errno-derived code when
  // the target cannot be examined.
  static absl::StatusOr<StagedDirectory> Create(const std::string& target,
                                                StagedDirectoryOptions options);

  // Creates the staging directory (and the target's missing parents) and
  // returns it, where the output is to be written; again, the same one.
  // The errno-derived code when a directory cannot be created.
  absl::StatusOr<std::string> Stage();

  StagedDirectory(StagedDirectory&& other) noexcept;
  StagedDirectory& operator=(StagedDirectory&&) = delete;
  ~StagedDirectory();

  // The staging directory; empty before Stage.
  const std::string& path() const { return staging_; }

  // Adds `path` to the options' `keep` once it is known (the model a job
  // imports is known after the output was checked): FailedPrecondition now
  // if the target is or holds it, and Commit checks it again.
  absl::Status Keep(const std::string& path, const std::string& what);

  // Makes the staged directory durable and moves it to the target, checked
  // again first (something may have appeared there). Errors as Create's,
  // FailedPrecondition before Stage, or the errno-derived code of a failed
  // fsync or rename (the target is then as it was). Call once.
  absl::StatusOr<Committed> Commit();

 private:
  StagedDirectory(std::string target, std::string shown,
                  StagedDirectoryOptions options)
      : target_(std::move(target)),
        shown_(std::move(shown)),
        options_(std::move(options)) {}

  std::string target_;  // Absolute.
  std::string shown_;   // As given, for messages.
  // Empty before Stage, and once committed or moved from.
  std::string staging_;
  StagedDirectoryOptions options_;
};

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_STAGED_DIRECTORY_H_
