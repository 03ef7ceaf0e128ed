// The BPE merge loop against a reference written the slow, obvious way (a
// list of strings; find the lowest-ranked adjacent pair, leftmost among
// equals; join it; repeat), on random merge tables over a small alphabet,
// where merges overlap and compete constantly. Both of the model's loops
// (the scan for short words, the heap for long ones) and its cached path
// must give the reference's ids.
#include "tokenizer/internal/bpe_model.h"

#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

struct Table {
  std::map<std::string, int32_t> ids;
  std::vector<std::pair<std::string, std::string>> merges;  // Rank order.
};

Table RandomTable(std::mt19937& gen, int merges) {
  Table table;
  for (int b = 0; b < 256; ++b) {
    table.ids[std::string(1, static_cast<char>(b))] = b;
  }
  std::vector<std::string> tokens = {"a", "b", "c", "d"};
  std::map<std::pair<std::string, std::string>, bool> used;
  while (static_cast<int>(table.merges.size()) < merges) {
    const std::string& left = tokens[gen() % tokens.size()];
    const std::string& right = tokens[gen() % tokens.size()];
    if (left.size() + right.size() > 8 || used[{left, right}]) continue;
    used[{left, right}] = true;
    table.merges.emplace_back(left, right);
    // Two merges may make the same token ("ab c" and "a bc").
    if (table.ids.emplace(left + right, 256 + tokens.size()).second) {
      tokens.push_back(left + right);
    }
  }
  return table;
}

std::vector<int64_t> Reference(const Table& table, const std::string& word) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t i = 0; i < table.merges.size(); ++i) rank[table.merges[i]] = i;
  std::vector<std::string> symbols;
  for (char c : word) symbols.emplace_back(1, c);
  while (true) {
    size_t best = symbols.size();
    size_t best_rank = table.merges.size();
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = rank.find({symbols[i], symbols[i + 1]});
      if (it != rank.end() && it->second < best_rank) {
        best = i;
        best_rank = it->second;
      }
    }
    if (best == symbols.size()) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + best + 1);
  }
  std::vector<int64_t> ids;
  for (const std::string& s : symbols) ids.push_back(table.ids.at(s));
  return ids;
}

BpeModel Model(const Table& table, bool ignore_merges) {
  absl::flat_hash_map<std::string, int32_t> vocab(table.ids.begin(),
                                                  table.ids.end());
  std::array<int32_t, 256> byte_ids;
  for (int b = 0; b < 256; ++b) byte_ids[b] = b;
  std::vector<BpeModel::Merge> merges;
  for (const auto& [left, right] : table.merges) {
    merges.push_back(
        {table.ids.at(left), table.ids.at(right), table.ids.at(left + right)});
  }
  return BpeModel(std::move(vocab), byte_ids, merges, ignore_merges);
}

TEST(BpeModelTest, ScanHeapAndCacheAgreeWithTheReference) {
  std::mt19937 gen(11);
  for (int round = 0; round < 20; ++round) {
    const Table table = RandomTable(gen, 5 + round * 3);
    const BpeModel model = Model(table, false);
    for (int i = 0; i < 60; ++i) {
      const size_t length = 1 + gen() % 150;
      std::string word(length, 'a');
      for (char& c : word) c = "abcd"[gen() % 4];
      const std::vector<int64_t> expected = Reference(table, word);
      std::vector<int64_t> heap;
      model.TEST_MergeWithHeap(word, &heap);
      EXPECT_EQ(heap, expected) << word;
      if (length <= BpeModel::kScanLimit) {
        std::vector<int64_t> scan;
        model.TEST_MergeWithScan(word, &scan);
        EXPECT_EQ(scan, expected) << word;
      }
      // Twice: the second comes from this thread's cache.
      std::vector<int64_t> appended = {-7};  // Encode appends.
      appended.insert(appended.end(), expected.begin(), expected.end());
      for (int pass = 0; pass < 2; ++pass) {
        std::vector<int64_t> cached = {-7};
        model.Encode(word, &cached);
        EXPECT_EQ(cached, appended) << word;
      }
    }
  }
}

TEST(BpeModelTest, IgnoreMergesTakesAWordInTheVocabularyWhole) {
  Table table;
  for (int b = 0; b < 256; ++b) {
    table.ids[std::string(1, static_cast<char>(b))] = b;
  }
  table.merges = {{"a", "b"}};
  table.ids["ab"] = 256;
  table.ids["ba"] = 257;  // In the vocabulary; no merge makes it.
  EXPECT_EQ(Reference(table, "ba"), (std::vector<int64_t>{98, 97}));
  std::vector<int64_t> ids;
  Model(table, false).Encode("ba", &ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{98, 97}));
  ids.clear();
  Model(table, true).Encode("ba", &ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{257}));
}

TEST(BpeModelTest, TwoModelsInOneThreadDoNotShareCachedIds) {
  Table first;
  Table second;
  for (Table* t : {&first, &second}) {
    for (int b = 0; b < 256; ++b) {
      t->ids[std::string(1, static_cast<char>(b))] = b;
    }
  }
  first.merges = {{"a", "b"}};
  first.ids["ab"] = 256;
  second.merges = {{"a", "b"}};
  second.ids["ab"] = 300;
  const BpeModel a = Model(first, false);
  const BpeModel b = Model(second, false);
  for (int i = 0; i < 3; ++i) {
    std::vector<int64_t> ids;
    a.Encode("ab", &ids);
    b.Encode("ab", &ids);
    EXPECT_EQ(ids, (std::vector<int64_t>{256, 300}));
  }
}

}  // namespace
}  // namespace conveyor::tokenizer::tokenizer_internal
