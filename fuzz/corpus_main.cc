// A main for fuzz targets without libFuzzer: runs every file under the paths
// on the command line (directories recursively, files in sorted order)
// through LLVMFuzzerTestOneInput once. Linked with each target as
// <target>_corpus_test, it makes the seed corpus a regression test in every
// build, whatever the compiler; given the crash-* file of a fuzzing run, it
// reproduces the crash under a debugger.
//
// Exits 0 once every input ran (a target that crashes ends the process), 1 if
// a path is missing or names no file, 2 on bad usage.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

// The regular files at `path` (itself, or everything under it), sorted; false
// if it does not exist.
bool CollectFiles(const fs::path& path, std::vector<fs::path>* files) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    files->push_back(path);
    return true;
  }
  if (!fs::is_directory(path, ec)) return false;
  std::vector<fs::path> found;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->is_regular_file(ec)) found.push_back(it->path());
  }
  if (ec) return false;
  std::sort(found.begin(), found.end());
  files->insert(files->end(), found.begin(), found.end());
  return true;
}

bool ReadFile(const fs::path& path, std::vector<uint8_t>* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes->assign(std::istreambuf_iterator<char>(in),
                std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string self = argc > 0 ? fs::path(argv[0]).filename().string()
                                    : std::string("corpus_test");
  if (argc < 2) {
    std::cerr << "usage: " << self << " CORPUS_DIR_OR_FILE...\n";
    return 2;
  }
  size_t total = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<fs::path> files;
    if (!CollectFiles(argv[i], &files)) {
      std::cerr << self << ": " << argv[i] << ": no such file or directory\n";
      return 1;
    }
    if (files.empty()) {
      std::cerr << self << ": " << argv[i] << ": no input files\n";
      return 1;
    }
    std::vector<uint8_t> bytes;
    for (const fs::path& file : files) {
      if (!ReadFile(file, &bytes)) {
        std::cerr << self << ": cannot read " << file.string() << "\n";
        return 1;
      }
      // A copy of exactly the file's size, so a sanitizer sees any read past
      // the end.
      const std::vector<uint8_t> input(bytes);
      LLVMFuzzerTestOneInput(input.data(), input.size());
      ++total;
    }
  }
  std::cout << self << ": ran " << total << " input(s)\n";
  return 0;
}
