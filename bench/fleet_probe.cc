#include "bench/fleet_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace conveyor::bench {
namespace {

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The value after "Key:" in /proc/<pid>/status or io, as an integer.
int64_t Field(const std::string& text, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, key)) continue;
    line = absl::StripLeadingAsciiWhitespace(line);
    std::vector<absl::string_view> words =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t v = 0;
    if (!words.empty() && absl::SimpleAtoi(words[0], &v)) return v;
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorProcess>> CoordinatorProcess::Start(
    const std::string& binary, const std::string& dir,
    const std::vector<std::string>& extra_args) {
  auto p = std::unique_ptr<CoordinatorProcess>(new CoordinatorProcess());
  p->state_file_ = dir + "/state.pb";
  const std::string ready = dir + "/ready";
  const std::string log = dir + "/coordinator.log";
  std::vector<std::string> args = {binary,
                                   "--listen=127.0.0.1:0",
                                   "--metrics-address=127.0.0.1:0",
                                   "--state-file=" + p->state_file_,
                                   "--ready-file=" + ready,
                                   "--log-level=warn"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Made before the fork: the child only calls what is safe after one.
  const std::string cannot_run = absl::StrCat("cannot run ", binary, "\n");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // The daemon goes with the simulator, however the simulator ends.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(binary.c_str(), argv.data());
    (void)!write(2, cannot_run.data(), cannot_run.size());
    _exit(127);
  }
  p->pid_ = pid;
  for (int i = 0; i < 600; ++i) {
    absl::StatusOr<std::string> text = ReadWhole(ready);
    if (text.ok() && absl::StrContains(*text, "metrics ")) {
      std::vector<std::string> lines =
          absl::StrSplit(*text, '\n', absl::SkipEmpty());
      p->address_ = lines[0];
      for (const std::string& l : lines) {
        if (absl::StartsWith(l, "metrics ")) p->metrics_address_ = l.substr(8);
      }
      return p;
    }
    if (!p->Alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  absl::StatusOr<std::string> said = ReadWhole(log);
  std::string tail = said.ok() ? *said : "";
  if (tail.size() > 2000) tail = tail.substr(tail.size() - 2000);
  return absl::UnavailableError(
      absl::StrCat(binary, " did not start",
                   tail.empty() ? std::string(" (it wrote nothing)")
                                : absl::StrCat("; its log ends:\n", tail)));
}

CoordinatorProcess::~CoordinatorProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
}

bool CoordinatorProcess::Alive() const {
  int status = 0;
  return waitpid(pid_, &status, WNOHANG) == 0;
}

absl::StatusOr<ProcStats> ReadProcStats(pid_t pid) {
  const std::string base = absl::StrCat("/proc/", pid);
  ProcStats s;
  absl::StatusOr<std::string> stat = ReadWhole(base + "/stat");
  if (!stat.ok()) return stat.status();
  // Fields after the command name (which may hold spaces): state is the
  // 3rd field, utime and stime the 14th and 15th.
  const size_t paren = stat->rfind(')');
  if (paren == std::string::npos) return absl::DataLossError("bad stat");
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(*stat).substr(paren + 2), ' ');
  int64_t utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) ||
      !absl::SimpleAtoi(f[12], &stime)) {
    return absl::DataLossError("bad stat");
  }
  s.cpu_seconds = static_cast<double>(utime + stime) /
                  static_cast<double>(sysconf(_SC_CLK_TCK));
  absl::StatusOr<std::string> status = ReadWhole(base + "/status");
  if (status.ok()) {
    s.rss_bytes = Field(*status, "VmRSS:") * 1024;
    s.peak_rss_bytes = Field(*status, "VmHWM:") * 1024;
    s.threads = Field(*status, "Threads:");
  }
  absl::StatusOr<std::string> io = ReadWhole(base + "/io");
  if (io.ok()) {
    s.write_bytes = Field(*io, "write_bytes:");
    s.wchar = Field(*io, "wchar:");
  }
  return s;
}

absl::StatusOr<std::string> HttpGet(const std::string& host_port,
                                    const std::string& path) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError("address without a port");
  }
  const std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host_port));
  }
  const int fd =
      socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  const bool connected =
      fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!connected) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", host_port));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("request not sent");
  }
  std::string response;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos || !absl::StartsWith(response, "HTTP/1.")) {
    return absl::DataLossError("not an HTTP response");
  }
  if (response.substr(9, 3) != "200") {
    return absl::InternalError(response.substr(0, response.find('\r')));
  }
  return response.substr(body + 4);
}

double Buckets::count() const {
  return cumulative.empty() ? 0 : cumulative.rbegin()->second;
}

Buckets ParseBuckets(const std::string& metrics_text, const std::string& name,
                     const std::string& label) {
  Buckets b;
  const std::string prefix = name + "_bucket{";
  for (absl::string_view line : absl::StrSplit(metrics_text, '\n')) {
    if (!absl::StartsWith(line, prefix) || !absl::StrContains(line, label)) {
      continue;
    }
    const size_t le = line.find("le=\"");
    const size_t end = line.find('"', le + 4);
    const size_t space = line.rfind(' ');
    if (le == absl::string_view::npos || end == absl::string_view::npos ||
        space == absl::string_view::npos) {
      continue;
    }
    const absl::string_view bound = line.substr(le + 4, end - le - 4);
    double upper = std::numeric_limits<double>::infinity();
    double value = 0;
    if (bound != "+Inf" && !absl::SimpleAtod(bound, &upper)) continue;
    if (!absl::SimpleAtod(line.substr(space + 1), &value)) continue;
    b.cumulative[upper] += value;
  }
  return b;
}

namespace {

// after - before, bucket by bucket.
std::map<double, double> Delta(const Buckets& before, const Buckets& after) {
  std::map<double, double> d;
  for (const auto& [le, n] : after.cumulative) {
    auto it = before.cumulative.find(le);
    d[le] = n - (it == before.cumulative.end() ? 0 : it->second);
  }
  return d;
}

}  // namespace

double QuantileBetween(const Buckets& before, const Buckets& after, double q) {
  const std::map<double, double> d = Delta(before, after);
  if (d.empty() || d.rbegin()->second <= 0) return std::nan("");
  const double rank = q * d.rbegin()->second;
  double lower = 0, below = 0;
  for (const auto& [le, n] : d) {
    if (n >= rank) {
      if (std::isinf(le)) return lower;  // Beyond the largest bound.
      const double in = n - below;
      return in <= 0 ? le : lower + (le - lower) * (rank - below) / in;
    }
    lower = le;
    below = n;
  }
  return lower;
}

double FractionAtOrBelow(const Buckets& before, const Buckets& after,
                         double bound) {
  const std::map<double, double> d = Delta(before, after);
  if (d.empty() || d.rbegin()->second <= 0) return std::nan("");
  double at = 0;
  for (const auto& [le, n] : d) {
    if (le <= bound) at = n;
  }
  return at / d.rbegin()->second;
}

namespace {

// The journal's framing (coordinator/state_journal.h), read here from the
// file rather than through that module: the bench sees the coordinator only
// from outside.
constexpr int64_t kJournalHeaderBytes = 20;
constexpr int64_t kRecordHeaderBytes = 16;

uint32_t LittleEndian32(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 |
         uint32_t{b[3]} << 24;
}

}  // namespace

StateFileWatcher::StateFileWatcher(std::string path)
    : path_(std::move(path)),
      journal_path_(path_ + ".journal"),
      thread_([this] { Run(); }) {}

StateFileWatcher::~StateFileWatcher() {
  stop_.store(true);
  thread_.join();
  if (journal_fd_ >= 0) close(journal_fd_);
}

StateFileWatcher::Seen StateFileWatcher::seen() const {
  return {appends_.load(),       appended_bytes_.load(),
          compactions_.load(),   compacted_bytes_.load(),
          snapshot_size_.load(), journal_size_.load()};
}

void StateFileWatcher::DrainJournal() {
  char buffer[1 << 16];
  while (true) {
    const ssize_t n =
        pread(journal_fd_, buffer, sizeof(buffer), journal_offset_);
    if (n <= 0) break;
    journal_offset_ += n;
    pending_.append(buffer, static_cast<size_t>(n));
  }
  size_t at = 0;
  while (pending_.size() - at >= kRecordHeaderBytes) {
    const int64_t frame =
        kRecordHeaderBytes + int64_t{LittleEndian32(pending_.data() + at)};
    // The rest of it is still being written (or read next poll).
    if (static_cast<int64_t>(pending_.size() - at) < frame) break;
    appends_.fetch_add(1);
    appended_bytes_.fetch_add(frame);
    at += static_cast<size_t>(frame);
  }
  pending_.erase(0, at);
}

void StateFileWatcher::Run() {
  ino_t snapshot_inode = 0;
  while (!stop_.load()) {
    struct stat st {};
    if (stat(path_.c_str(), &st) == 0) {
      if (snapshot_inode != 0 && st.st_ino != snapshot_inode) {
        compactions_.fetch_add(1);
        compacted_bytes_.fetch_add(st.st_size);
      }
      snapshot_inode = st.st_ino;
      snapshot_size_.store(st.st_size);
    }
    // The journal's path first, then what the open one holds: when the
    // path has moved on, the coordinator appends only to the new journal,
    // so the old one, read to its end after the stat, is whole.
    struct stat now {};
    const bool exists = stat(journal_path_.c_str(), &now) == 0;
    if (journal_fd_ >= 0) {
      DrainJournal();
      struct stat open_one {};
      if (!exists || fstat(journal_fd_, &open_one) != 0 ||
          open_one.st_ino != now.st_ino || open_one.st_dev != now.st_dev) {
        close(journal_fd_);
        journal_fd_ = -1;
      }
    }
    if (journal_fd_ < 0 && exists) {
      journal_fd_ = open(journal_path_.c_str(), O_RDONLY | O_CLOEXEC);
      journal_offset_ = kJournalHeaderBytes;
      pending_.clear();
      if (journal_fd_ >= 0) DrainJournal();
    }
    if (exists) journal_size_.store(now.st_size);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

absl::StatusOr<double> TimeDurableWrite(const std::string& dir, int64_t bytes,
                                        int repeats) {
  const std::string data(static_cast<size_t>(std::max<int64_t>(bytes, 1)), 'x');
  const std::string tmp = dir + "/durable-write.tmp";
  const std::string final_path = dir + "/durable-write";
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", tmp));
    const bool ok = write(fd, data.data(), data.size()) ==
                        static_cast<ssize_t>(data.size()) &&
                    fsync(fd) == 0;
    close(fd);
    if (!ok || rename(tmp.c_str(), final_path.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
    const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  unlink(final_path.c_str());
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

absl::StatusOr<double> TimeDurableAppend(const std::string& dir, int64_t bytes,
                                         int repeats) {
  const std::string data(static_cast<size_t>(std::max<int64_t>(bytes, 1)), 'x');
  const std::string path = dir + "/durable-append";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path));
  // A header made durable first, as a journal's is when it is made, so
  // that the appends below time only what each record costs.
  const std::string header(static_cast<size_t>(kJournalHeaderBytes), 'h');
  bool ok = write(fd, header.data(), header.size()) ==
                static_cast<ssize_t>(header.size()) &&
            fsync(fd) == 0;
  off_t end = static_cast<off_t>(header.size());
  std::vector<double> times;
  for (int i = 0; ok && i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    ok = pwrite(fd, data.data(), data.size(), end) ==
             static_cast<ssize_t>(data.size()) &&
         fdatasync(fd) == 0;
    end += static_cast<off_t>(data.size());
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  close(fd);
  unlink(path.c_str());
  if (!ok) return absl::InternalError(absl::StrCat("cannot append to ", path));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace conveyor::bench
