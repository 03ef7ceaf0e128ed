#include "tokenizer/internal/bpe_model.h"

#include <atomic>
#include <limits>
#include <queue>
#include <utility>

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

constexpr uint32_t kNoMerge = std::numeric_limits<uint32_t>::max();

// Words longer than this are rare enough again that caching them costs more
// than it saves.
constexpr size_t kMaxCachedWord = 48;
// A thread's cache is dropped whole when it grows past this: simpler than
// an LRU, and a text's common words come back within a few pages.
constexpr size_t kMaxCachedWords = 1 << 16;

// Ids of short words this thread has merged, for one model at a time.
struct WordCache {
  uint64_t owner = 0;
  // Word -> (offset, count) in `ids`.
  absl::flat_hash_map<std::string, std::pair<uint32_t, uint32_t>> words;
  std::vector<int32_t> ids;
};

WordCache& ThreadCache(uint64_t owner) {
  thread_local WordCache cache;
  if (cache.owner != owner || cache.words.size() >= kMaxCachedWords) {
    cache.owner = owner;
    cache.words.clear();
    cache.ids.clear();
  }
  return cache;
}

uint64_t NextCacheOwner() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

BpeModel::BpeModel(absl::flat_hash_map<std::string, int32_t> byte_vocab,
                   const std::array<int32_t, 256>& byte_ids,
                   const std::vector<Merge>& merges, bool ignore_merges)
    : byte_vocab_(std::move(byte_vocab)),
      byte_ids_(byte_ids),
      ignore_merges_(ignore_merges),
      cache_owner_(NextCacheOwner()) {
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& merge = merges[rank];
    merges_.emplace(PairKey(merge.left, merge.right),
                    Rank{static_cast<uint32_t>(rank), merge.result});
  }
}

int32_t BpeModel::Find(absl::string_view bytes) const {
  const auto it = byte_vocab_.find(bytes);
  return it == byte_vocab_.end() ? -1 : it->second;
}

const BpeModel::Rank* BpeModel::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::Encode(absl::string_view word, std::vector<int64_t>* ids) const {
  if (word.size() == 1) {
    ids->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    if (const int32_t id = Find(word); id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  if (word.size() > kMaxCachedWord) {
    if (word.size() > kScanLimit) {
      MergeWithHeap(word, ids);
    } else {
      MergeWithScan(word, ids);
    }
    return;
  }
  WordCache& cache = ThreadCache(cache_owner_);
  if (const auto it = cache.words.find(word); it != cache.words.end()) {
    const auto [offset, count] = it->second;
    ids->insert(ids->end(), cache.ids.begin() + offset,
                cache.ids.begin() + offset + count);
    return;
  }
  const size_t first = ids->size();
  MergeWithScan(word, ids);
  const auto offset = static_cast<uint32_t>(cache.ids.size());
  cache.ids.insert(cache.ids.end(), ids->begin() + first, ids->end());
  cache.words.emplace(
      std::string(word),
      std::make_pair(offset, static_cast<uint32_t>(ids->size() - first)));
}

void BpeModel::MergeWithScan(absl::string_view word,
                             std::vector<int64_t>* ids) const {
  // symbols[i] and the merge of (symbols[i], symbols[i + 1]); both shrink
  // by one with each merge.
  int32_t symbols[kScanLimit];
  Rank pairs[kScanLimit];
  size_t count = word.size();
  for (size_t i = 0; i < count; ++i) {
    symbols[i] = byte_ids_[static_cast<unsigned char>(word[i])];
  }
  const auto rank_of = [&](size_t i) {
    const Rank* merge = FindMerge(symbols[i], symbols[i + 1]);
    return merge == nullptr ? Rank{kNoMerge, 0} : *merge;
  };
  for (size_t i = 0; i + 1 < count; ++i) pairs[i] = rank_of(i);
  while (count > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < count; ++i) {
      if (pairs[i].rank < pairs[best].rank) best = i;  // Leftmost of equals.
    }
    if (pairs[best].rank == kNoMerge) break;
    symbols[best] = pairs[best].result;
    for (size_t i = best + 1; i + 1 < count; ++i) {
      symbols[i] = symbols[i + 1];
      pairs[i] = pairs[i + 1];
    }
    --count;
    if (best > 0) pairs[best - 1] = rank_of(best - 1);
    if (best + 1 < count) pairs[best] = rank_of(best);
  }
  ids->insert(ids->end(), symbols, symbols + count);
}

void BpeModel::MergeWithHeap(absl::string_view word,
                             std::vector<int64_t>* ids) const {
  // A doubly linked list over the bytes' slots; a merged-away slot is dead.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;  // The left symbol's slot: slots keep the text's order.
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<unsigned char>(word[i])], i - 1,
                  i + 1 < n ? i + 1 : -1, true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const Rank* merge = FindMerge(symbols[pos].id, symbols[next].id)) {
      queue.push({merge->rank, pos});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Stale when either side has changed since it was queued.
    const Rank* merge = FindMerge(left.id, symbols[left.next].id);
    if (merge == nullptr || merge->rank != top.rank) continue;
    Symbol& right = symbols[left.next];
    left.id = merge->result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next)
    ids->push_back(symbols[i].id);
}

void BpeModel::TEST_MergeWithScan(absl::string_view word,
                                  std::vector<int64_t>* ids) const {
  MergeWithScan(word, ids);
}

void BpeModel::TEST_MergeWithHeap(absl::string_view word,
                                  std::vector<int64_t>* ids) const {
  MergeWithHeap(word, ids);
}

}  // namespace conveyor::tokenizer::tokenizer_internal
