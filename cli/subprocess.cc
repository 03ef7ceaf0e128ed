#include "cli/subprocess.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file.h"

namespace conveyor::cli {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(10);
constexpr std::streamoff kMaxTailBytes = 64 << 10;

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) {
    return absl::StrCat("exited with status ", WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

// Runs in the child between fork and exec, where only async-signal-safe
// calls are allowed: the parent may have other threads (gRPC's) holding
// locks that will never be released in the child.
[[noreturn]] void ExecChild(char* const* argv, int null_fd, int log_fd,
                            int error_fd, pid_t parent) {
  // First the dispositions: until exec, a handler inherited from conveyorctl
  // (run's InterruptHandler) would write to conveyorctl's signal pipe.
  // Dispositions set to "ignore" survive exec (nohup, a shell's `&`), and so
  // does the signal mask: the daemon must start with the defaults to be
  // stoppable.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT}) {
    sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have died before prctl took effect; then nobody would
  // ever send the signal.
  if (getppid() != parent) _exit(127);
  if (dup2(null_fd, STDIN_FILENO) < 0 || dup2(log_fd, STDOUT_FILENO) < 0 ||
      dup2(log_fd, STDERR_FILENO) < 0) {
    const int err = errno;
    (void)!write(error_fd, &err, sizeof(err));
    _exit(127);
  }
  execv(argv[0], argv);
  const int err = errno;
  (void)!write(error_fd, &err, sizeof(err));
  _exit(127);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(
    const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty() || argv[0].empty()) {
    return absl::InvalidArgumentError("Subprocess::Spawn: empty argv");
  }
  const std::string& binary = argv[0];
  const int log_fd =
      open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return ErrnoError(errno, log_path, "open");
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    const int err = errno;
    close(log_fd);
    return ErrnoError(err, "/dev/null", "open");
  }
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    close(log_fd);
    close(null_fd);
    return ErrnoError(err, binary, "pipe2");
  }
  // Everything the child needs is prepared before fork: it may not
  // allocate.
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& arg : argv)
    args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid == 0) {
    ExecChild(args.data(), null_fd, log_fd, error_pipe[1], parent);
  }
  const int fork_errno = errno;
  close(error_pipe[1]);
  close(log_fd);
  close(null_fd);
  if (pid < 0) {
    close(error_pipe[0]);
    return ErrnoError(fork_errno, binary, "fork");
  }
  // The pipe closes without data when exec succeeds (close-on-exec), or
  // carries exec's errno when it fails.
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(error_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(error_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    waitpid(pid, nullptr, 0);
    return ErrnoError(exec_errno, binary, "exec");
  }
  return std::unique_ptr<Subprocess>(new Subprocess(
      pid, std::filesystem::path(binary).filename().string(), log_path));
}

Subprocess::~Subprocess() {
  if (reaped_) return;
  kill(pid_, SIGKILL);
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

std::optional<std::string> Subprocess::Poll() {
  if (reaped_) return ended_;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    ended_ = DescribeWaitStatus(status);
    reaped_ = true;
  } else if (r < 0 && errno == ECHILD) {
    ended_ = "ended (reaped elsewhere)";
    reaped_ = true;
  }
  return ended_;
}

void Subprocess::Signal(int signal) {
  if (!reaped_) kill(pid_, signal);
}

bool Subprocess::WaitFor(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!Poll().has_value()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(kPollInterval);
  }
  return true;
}

std::string TailFile(const std::string& path, int max_lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::StrCat("  (cannot read: ", std::strerror(errno), ")");
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > kMaxTailBytes ? size - kMaxTailBytes : 0;
  in.seekg(start);
  std::string text(static_cast<size_t>(size - start), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  std::vector<std::string> lines =
      absl::StrSplit(text, '\n', absl::SkipWhitespace());
  if (lines.empty()) return "  (empty)";
  if (static_cast<int>(lines.size()) > max_lines) {
    lines.erase(lines.begin(), lines.end() - max_lines);
  }
  return absl::StrCat("  ", absl::StrJoin(lines, "\n  "));
}

}  // namespace conveyor::cli
