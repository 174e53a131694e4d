#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "base/status.h"

namespace spw::tok {

namespace {

uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

constexpr size_t kCacheShards = 16;
constexpr size_t kCacheSlotsPerShard = 1 << 14;        // direct-mapped: a colliding word evicts
constexpr size_t kCacheArenaBytesPerShard = 4 << 20;   // keys + ids; the shard resets when full
constexpr size_t kMaxCachedWordBytes = 256;

uint64_t hash_bytes(std::string_view s) { return std::hash<std::string_view>{}(s); }

}  // namespace

// Open-addressing map (left id, right id) -> (rank, merged id). The merge loop does one lookup per
// candidate pair, so this sits on the encode hot path for uncached words.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key = ~0ULL;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;

  explicit MergeTable(const std::vector<std::array<int32_t, 3>>& merges) {
    size_t cap = 16;
    while (cap < merges.size() * 2) cap <<= 1;
    slots.resize(cap);
    mask = cap - 1;
    for (size_t r = 0; r < merges.size(); ++r) {
      const uint64_t key = pack(merges[r][0], merges[r][1]);
      uint64_t h = mix64(key) & mask;
      while (slots[h].key != ~0ULL && slots[h].key != key) h = (h + 1) & mask;
      if (slots[h].key == key) continue;  // duplicate pair: the first (lowest) rank wins
      slots[h] = {key, static_cast<int32_t>(r), merges[r][2]};
    }
  }
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Slot* find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    uint64_t h = mix64(key) & mask;
    while (true) {
      const Slot& s = slots[h];
      if (s.key == key) return &s;
      if (s.key == ~0ULL) return nullptr;
      h = (h + 1) & mask;
    }
  }
};

// Pre-token -> ids cache. Each shard is a direct-mapped table over append-only arenas, so a hit
// costs one hash, one slot read and one memcmp, with no per-entry allocation.
struct BpeModel::Cache {
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0;
    uint32_t ids_offset = 0;
    uint16_t key_nbytes = 0;
    uint16_t n_ids = 0;
    bool used = false;
  };
  struct Shard {
    std::mutex mu;
    std::vector<Slot> slots = std::vector<Slot>(kCacheSlotsPerShard);
    std::string keys;
    std::vector<int32_t> ids;
  };
  std::array<Shard, kCacheShards> shards;
};

BpeModel::BpeModel(BpeConfig config)
    : merges_(std::make_unique<MergeTable>(config.merges)),
      cache_(std::make_unique<Cache>()),
      unk_id_(config.unk_id),
      fuse_unk_(config.fuse_unk),
      ignore_merges_(config.ignore_merges) {
  byte_id_.fill(-1);
  for (const auto& [bytes, id] : config.vocab_bytes) {
    if (bytes.size() == 1) byte_id_[static_cast<uint8_t>(bytes[0])] = id;
  }
  if (ignore_merges_) {
    for (auto& [bytes, id] : config.vocab_bytes) vocab_.emplace(std::move(bytes), id);
  }
}

BpeModel::~BpeModel() = default;

void BpeModel::encode(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1 && !unk_id_) {
    const int32_t id = byte_id_[static_cast<uint8_t>(word[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (word.size() == 2 || word.size() > kMaxCachedWordBytes) {
    merge_word(word, out);  // two bytes cost one merge lookup: cheaper than the cache
    return;
  }
  const uint64_t h = hash_bytes(word);
  Cache::Shard& shard = cache_->shards[h % kCacheShards];
  Cache::Slot& slot = shard.slots[(h / kCacheShards) % kCacheSlotsPerShard];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (slot.used && slot.hash == h && slot.key_nbytes == word.size() &&
        std::memcmp(shard.keys.data() + slot.key_offset, word.data(), word.size()) == 0) {
      out.insert(out.end(), shard.ids.begin() + slot.ids_offset, shard.ids.begin() + slot.ids_offset + slot.n_ids);
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  const size_t n_ids = out.size() - first;
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.keys.size() + word.size() + 4 * (shard.ids.size() + n_ids) > kCacheArenaBytesPerShard) {
    shard.keys.clear();
    shard.ids.clear();
    for (Cache::Slot& s : shard.slots) s.used = false;
  }
  slot = {h, static_cast<uint32_t>(shard.keys.size()), static_cast<uint32_t>(shard.ids.size()),
          static_cast<uint16_t>(word.size()), static_cast<uint16_t>(n_ids), true};
  shard.keys.append(word);
  shard.ids.insert(shard.ids.end(), out.begin() + first, out.end());
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols as a doubly linked list over the word's bytes.
  thread_local std::vector<int32_t> ids, prev, next;
  ids.clear();
  for (const char ch : word) {
    const int32_t id = byte_id_[static_cast<uint8_t>(ch)];
    if (id >= 0) {
      ids.push_back(id);
    } else if (unk_id_) {
      if (!(fuse_unk_ && !ids.empty() && ids.back() == *unk_id_)) ids.push_back(*unk_id_);
    }
  }
  const int32_t n = static_cast<int32_t>(ids.size());
  prev.resize(n);
  next.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // Min-heap on (rank, position): lowest rank first, leftmost among equal ranks.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
  };
  auto later = [](const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  thread_local std::vector<Candidate> heap;
  heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const auto* m = merges_->find(ids[i], ids[i + 1])) heap.push_back({m->rank, i, m->merged});
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    const int32_t left = c.pos;
    if (ids[left] < 0) continue;  // merged away
    const int32_t right = next[left];
    if (right < 0) continue;
    const auto* m = merges_->find(ids[left], ids[right]);
    if (m == nullptr || m->merged != c.merged || m->rank != c.rank) continue;  // stale candidate
    ids[left] = c.merged;
    ids[right] = -1;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    if (prev[left] >= 0) {
      if (const auto* pm = merges_->find(ids[prev[left]], ids[left])) {
        heap.push_back({pm->rank, prev[left], pm->merged});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    if (next[left] >= 0) {
      if (const auto* nm = merges_->find(ids[left], ids[next[left]])) {
        heap.push_back({nm->rank, left, nm->merged});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
  }
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) out.push_back(ids[i]);
}

}  // namespace spw::tok
