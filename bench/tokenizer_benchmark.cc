// Tokenizer throughput on English text, per core: `conveyorctl tokenize`
// (cli/tokenize_command.h) on one thread and on every core, and the
// tokenizer's Encode alone on one thread.
//
// The text: Debian's license texts (/usr/share/common-licenses) and its
// packages' copyright files (/usr/share/doc/*/copyright), about 10 MB of
// English prose with names, addresses and code-like lists, one document
// per file, as JSON lines. No real tokenizer.json ships with Debian, so the
// benchmark trains one shaped like Llama-3's: byte-level BPE with
// 8000 merges learned from the first 4 MB of that text (a plain BPE
// trainer below, on words split the way Llama-3's pattern splits English),
// Llama-3's split pattern, ignore_merges, and its two special tokens.
//
// Rows tokenize/encode/threads:1, tokenize/command/threads:1 and
// tokenize/command/threads:N (N = the cores); counters MB_per_s (wall
// clock), MB_per_s_per_core (that over the threads; target >= 5 for the
// command) and MB_per_cpu_s (over the CPU time of all threads: what a core
// gives when the machine is shared, as a development machine often is).
//
//   cmake --build build-bench --target tokenizer_benchmark
//   build-bench/bench/tokenizer_benchmark
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"   // defines: State, RegisterBenchmark
#include "cli/tokenize_command.h"  // defines: RunTokenizeCommand
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"  // defines: Tokenizer

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kCorpusBytes = size_t{8} << 20;
constexpr size_t kTrainingBytes = size_t{4} << 20;
constexpr int kMerges = 8000;
constexpr char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::vector<std::string> ReadCorpus() {
  std::vector<fs::path> files;
  std::set<fs::path> seen;  // The license links point at the same texts.
  std::error_code ec;
  for (const auto& entry :
       fs::directory_iterator("/usr/share/common-licenses", ec)) {
    files.push_back(entry.path());
  }
  for (const auto& entry : fs::directory_iterator("/usr/share/doc", ec)) {
    files.push_back(entry.path() / "copyright");
  }
  std::sort(files.begin() + 0, files.end());
  std::vector<std::string> documents;
  size_t total = 0;
  for (const fs::path& file : files) {
    const fs::path real = fs::weakly_canonical(file, ec);
    if (ec || !fs::is_regular_file(real, ec) || !seen.insert(real).second) {
      continue;
    }
    std::ifstream in(real, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().empty()) continue;
    documents.push_back(text.str());
    total += documents.back().size();
    if (total >= kCorpusBytes) break;
  }
  return documents;
}

// Words as Llama-3's pattern makes them of English: letters with one
// leading non-letter, digits in threes, punctuation with a leading space,
// white space. (Bytes >= 0x80 count as letters: close enough to train on.)
void SplitWords(const std::string& text,
                absl::flat_hash_map<std::string, int64_t>* counts) {
  const auto letter = [](unsigned char c) {
    return std::isalpha(c) || c >= 0x80;
  };
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    const auto c = static_cast<unsigned char>(text[i]);
    if (letter(c) ||
        (c != '\n' && c != '\r' && !std::isdigit(c) && i + 1 < text.size() &&
         letter(static_cast<unsigned char>(text[i + 1])))) {
      ++i;
      while (i < text.size() && letter(static_cast<unsigned char>(text[i])))
        ++i;
    } else if (std::isdigit(c)) {
      while (i < text.size() && i - start < 3 && std::isdigit(text[i])) ++i;
    } else if (std::isspace(c)) {
      while (i < text.size() &&
             std::isspace(static_cast<unsigned char>(text[i])))
        ++i;
    } else {
      ++i;
      while (i < text.size() &&
             std::ispunct(static_cast<unsigned char>(text[i])))
        ++i;
    }
    ++(*counts)[text.substr(start, i - start)];
  }
}

// Byte-pair encoding training: repeatedly merge the most frequent adjacent
// pair (ties to the smaller pair of ids), counts kept up to date in the
// words a merge touches. Returns the merges as byte strings, in rank order.
std::vector<std::pair<std::string, std::string>> TrainBpe(
    const std::vector<std::string>& documents) {
  absl::flat_hash_map<std::string, int64_t> counts;
  size_t bytes = 0;
  for (const std::string& d : documents) {
    SplitWords(d, &counts);
    if ((bytes += d.size()) >= kTrainingBytes) break;
  }
  std::vector<std::string> token(256);
  for (int b = 0; b < 256; ++b) token[b] = std::string(1, static_cast<char>(b));
  absl::flat_hash_map<std::string, int> id_of;
  for (int b = 0; b < 256; ++b) id_of[token[b]] = b;
  struct Word {
    std::vector<int> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [text, count] : counts) {
    Word w{{}, count};
    for (char c : text) w.symbols.push_back(static_cast<unsigned char>(c));
    words.push_back(std::move(w));
  }
  const auto key = [](int a, int b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
  };
  absl::flat_hash_map<uint64_t, int64_t> pair_count;
  absl::flat_hash_map<uint64_t, std::vector<int>> where;
  using Entry = std::pair<int64_t, uint64_t>;  // (count, pair)
  const auto cmp = [](const Entry& x, const Entry& y) {
    return x.first != y.first ? x.first < y.first : x.second > y.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  const auto add_pairs = [&](int w, int64_t sign) {
    const Word& word = words[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const uint64_t p = key(word.symbols[i], word.symbols[i + 1]);
      int64_t& n = pair_count[p];
      n += sign * word.count;
      if (sign > 0) where[p].push_back(w);
      heap.push({n, p});
    }
  };
  for (int w = 0; w < static_cast<int>(words.size()); ++w) add_pairs(w, 1);
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<int> stamp(words.size(), -1);
  while (static_cast<int>(merges.size()) < kMerges && !heap.empty()) {
    const auto [n, p] = heap.top();
    heap.pop();
    if (n <= 0 || pair_count[p] != n) continue;  // Stale.
    const int a = static_cast<int>(p >> 32);
    const int b = static_cast<int>(p & 0xFFFFFFFF);
    const std::string joined = token[a] + token[b];
    int merged;
    if (const auto it = id_of.find(joined); it != id_of.end()) {
      merged = it->second;
    } else {
      merged = static_cast<int>(token.size());
      token.push_back(joined);
      id_of[joined] = merged;
    }
    merges.emplace_back(token[a], token[b]);
    const int round = static_cast<int>(merges.size());
    for (int w : std::vector<int>(where[p])) {
      if (stamp[w] == round) continue;
      stamp[w] = round;
      add_pairs(w, -1);
      std::vector<int>& s = words[w].symbols;
      std::vector<int> next;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(s[i]);
        }
      }
      s = std::move(next);
      add_pairs(w, 1);
    }
  }
  return merges;
}

// GPT-2's byte-level alphabet (tokenizer/internal/byte_level.h).
std::string ByteLevel(const std::string& bytes) {
  std::string out;
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    int code = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
      code = 256 + (b <= 0x20   ? b
                    : b == 0x7F ? 33
                    : b <= 0xA0 ? b - 0x80 + 34
                                : 67);
    }
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }
  return out;
}

std::string TokenizerJson(
    const std::vector<std::pair<std::string, std::string>>& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    vocab[ByteLevel(std::string(1, static_cast<char>(b)))] = next++;
  }
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    const std::string joined = ByteLevel(a + b);
    if (!vocab.contains(joined)) vocab[joined] = next++;
    merge_list.push_back(ByteLevel(a) + " " + ByteLevel(b));
  }
  nlohmann::json added = nlohmann::json::array();
  for (const char* special : {"<|begin_of_text|>", "<|end_of_text|>"}) {
    added.push_back({{"id", next++},
                     {"content", special},
                     {"special", true},
                     {"normalized", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false}});
  }
  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", true},
                                     {"use_regex", false}};
  return nlohmann::json{{"added_tokens", added},
                        {"normalizer", nullptr},
                        {"pre_tokenizer",
                         {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"},
                             {"pattern", {{"Regex", kLlama3Pattern}}},
                             {"behavior", "Isolated"},
                             {"invert", false}},
                            byte_level}}}},
                        {"decoder", byte_level},
                        {"model",
                         {{"type", "BPE"},
                          {"ignore_merges", true},
                          {"vocab", vocab},
                          {"merges", merge_list}}}}
      .dump();
}

struct Setup {
  std::string dir;
  std::vector<std::string> documents;
  size_t bytes = 0;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::string error;
};

const Setup& GetSetup() {
  static Setup* setup = [] {
    auto* s = new Setup;
    s->dir = (fs::temp_directory_path() /
              absl::StrCat("conveyor_tokenizer_bench_", getpid()))
                 .string();
    fs::create_directories(s->dir);
    s->documents = ReadCorpus();
    if (s->documents.empty()) {
      s->error = "no text under /usr/share/common-licenses or /usr/share/doc";
      return s;
    }
    std::ofstream(s->dir + "/tokenizer.json")
        << TokenizerJson(TrainBpe(s->documents));
    std::ofstream jsonl(s->dir + "/corpus.jsonl");
    for (const std::string& d : s->documents) {
      s->bytes += d.size();
      jsonl << nlohmann::json{{"text", d}}.dump(
                   -1, ' ', false, nlohmann::json::error_handler_t::replace)
            << "\n";
    }
    absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> t =
        tokenizer::Tokenizer::Load(s->dir);
    if (t.ok()) {
      s->tokenizer = *std::move(t);
    } else {
      s->error = std::string(t.status().message());
    }
    return s;
  }();
  return *setup;
}

// The CPU time of every thread of this process.
double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// `bytes` were tokenized in `seconds` on `threads` threads, using
// `cpu_seconds` of CPU: MB per CPU second is the throughput per core a
// machine to itself would give, whatever else shares this one.
void Report(benchmark::State& state, double bytes, double seconds,
            double cpu_seconds, int threads) {
  const double mb_per_s = bytes / seconds / 1e6;
  state.counters["MB_per_s"] = mb_per_s;
  state.counters["MB_per_s_per_core"] = mb_per_s / threads;
  state.counters["MB_per_cpu_s"] = bytes / cpu_seconds / 1e6;
  state.counters["threads"] = threads;
  state.counters["corpus_MB"] = GetSetup().bytes / 1e6;
}

void BM_Encode(benchmark::State& state) {
  const Setup& s = GetSetup();
  if (!s.error.empty()) return state.SkipWithError(s.error.c_str());
  int64_t tokens = 0;
  double seconds = 0;
  double cpu_seconds = 0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    const double cpu_start = ProcessCpuSeconds();
    for (const std::string& d : s.documents) {
      absl::StatusOr<std::vector<int64_t>> ids = s.tokenizer->Encode(d);
      if (!ids.ok())
        return state.SkipWithError(ids.status().ToString().c_str());
      tokens += static_cast<int64_t>(ids->size());
    }
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    cpu_seconds += ProcessCpuSeconds() - cpu_start;
  }
  Report(state, static_cast<double>(s.bytes) * state.iterations(), seconds,
         cpu_seconds, 1);
  state.counters["bytes_per_token"] =
      static_cast<double>(s.bytes * state.iterations()) / tokens;
}

void BM_Command(benchmark::State& state) {
  const Setup& s = GetSetup();
  if (!s.error.empty()) return state.SkipWithError(s.error.c_str());
  const int threads = static_cast<int>(state.range(0));
  cli::TokenizeCommandOptions options;
  options.tokenizer = s.dir;
  options.inputs = {s.dir + "/corpus.jsonl"};
  options.output = s.dir + "/out";
  options.threads = threads;
  options.overwrite = true;
  double seconds = 0;
  double cpu_seconds = 0;
  for (auto _ : state) {
    std::ostringstream out;
    std::ostringstream err;
    const Clock::time_point start = Clock::now();
    const double cpu_start = ProcessCpuSeconds();
    const absl::Status status =
        cli::RunTokenizeCommand(options, false, out, err);
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    cpu_seconds += ProcessCpuSeconds() - cpu_start;
    if (!status.ok()) return state.SkipWithError(status.ToString().c_str());
  }
  Report(state, static_cast<double>(s.bytes) * state.iterations(), seconds,
         cpu_seconds, threads);
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  const int cores =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  benchmark::RegisterBenchmark("tokenize/encode/threads:1", conveyor::BM_Encode)
      ->Iterations(2)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  for (int threads : std::set<int>{1, cores}) {
    benchmark::RegisterBenchmark("tokenize/command", conveyor::BM_Command)
        ->Arg(threads)
        ->ArgName("threads")
        ->Iterations(2)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(conveyor::GetSetup().dir, ec);
  return 0;
}
