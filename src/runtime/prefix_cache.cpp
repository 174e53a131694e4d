#include "runtime/prefix_cache.h"

#include <algorithm>

namespace spw::runtime {
namespace {

template <class T>
size_t vec_nbytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64 finaliser over (h, v): cheap and well distributed.
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

PrefixCache::PrefixCache(int block_tokens, size_t max_nbytes, int max_entries)
    : block_tokens_(block_tokens), max_nbytes_(max_nbytes), max_entries_(max_entries) {}

uint64_t PrefixCache::chain(uint64_t parent, std::span<const int32_t> block) const {
  uint64_t h = mix(parent, block.size());
  for (int32_t t : block) h = mix(h, uint32_t(t));
  return h;
}

std::vector<std::pair<uint64_t, size_t>> PrefixCache::candidates(std::span<const int32_t> tokens,
                                                                   int64_t max_len) const {
  const int64_t n_blocks = entries_.empty() ? 0 : std::min<int64_t>(max_len, int64_t(tokens.size())) / block_tokens_;
  std::vector<std::pair<uint64_t, size_t>> out;
  uint64_t h = 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    h = chain(h, tokens.subspan(size_t(b * block_tokens_), size_t(block_tokens_)));
    out.push_back({h, size_t(b + 1) * size_t(block_tokens_)});
  }
  std::reverse(out.begin(), out.end());
  return out;
}

const PrefixCache::Entry* PrefixCache::entry_for(std::pair<uint64_t, size_t> candidate,
                                                 std::span<const int32_t> tokens) const {
  auto it = entries_.find(candidate.first);
  if (it == entries_.end()) return nullptr;
  const Entry& e = it->second;
  if (e.tokens.size() != candidate.second || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin())) return nullptr;
  return &e;
}

std::pair<int64_t, std::unique_ptr<RunnerSequence>> PrefixCache::lookup(std::span<const int32_t> tokens,
                                                                         int64_t max_len) {
  for (const auto& candidate : candidates(tokens, max_len)) {
    const Entry* e = entry_for(candidate, tokens);
    if (!e) continue;
    auto copy = e->state->clone();
    if (!copy) continue;
    lru_.splice(lru_.begin(), lru_, e->lru);
    return {int64_t(e->tokens.size()), std::move(copy)};
  }
  return {0, nullptr};
}

const RunnerSequence* PrefixCache::peek(std::span<const int32_t> tokens, int64_t max_len) const {
  for (const auto& candidate : candidates(tokens, max_len))
    if (const Entry* e = entry_for(candidate, tokens)) return e->state.get();
  return nullptr;
}

void PrefixCache::insert(std::span<const int32_t> prefix, const RunnerSequence& state,
                         std::span<const std::span<const int32_t>> keep) {
  if (prefix.empty() || prefix.size() % size_t(block_tokens_) != 0 || max_nbytes_ == 0 || max_entries_ == 0) return;
  uint64_t h = 0;
  for (size_t i = 0; i < prefix.size(); i += size_t(block_tokens_)) h = chain(h, prefix.subspan(i, size_t(block_tokens_)));
  auto found = entries_.find(h);
  if (found != entries_.end()) {
    lru_.splice(lru_.begin(), lru_, found->second.lru);
    return;
  }
  // Room first: a runner's copies may need the slots older entries hold.
  if (max_entries_ > 0 && !evict_to(max_nbytes_, size_t(max_entries_) - 1, keep)) return;
  Entry e;
  e.tokens.assign(prefix.begin(), prefix.end());
  e.state = state.clone();
  if (!e.state) return;
  e.nbytes = e.state->nbytes() + vec_nbytes(e.tokens);
  if (e.nbytes > max_nbytes_) return;
  if (!evict_to(max_nbytes_ - e.nbytes, max_entries_ < 0 ? entries_.size() : size_t(max_entries_) - 1, keep)) return;
  lru_.push_front(h);
  e.lru = lru_.begin();
  nbytes_ += e.nbytes;
  entries_.emplace(h, std::move(e));
}

bool PrefixCache::evict_oldest(std::span<const int32_t> keep) {
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    auto entry = entries_.find(*it);
    const std::vector<int32_t>& t = entry->second.tokens;
    if (t.size() <= keep.size() && std::equal(t.begin(), t.end(), keep.begin())) continue;
    nbytes_ -= entry->second.nbytes;
    entries_.erase(entry);
    lru_.erase(std::next(it).base());
    return true;
  }
  return false;
}

bool PrefixCache::evict_to(size_t max_nbytes, size_t max_entries, std::span<const std::span<const int32_t>> keep) {
  const auto kept = [&](const std::vector<int32_t>& t) {
    return std::any_of(keep.begin(), keep.end(), [&](std::span<const int32_t> k) {
      return t.size() <= k.size() && std::equal(t.begin(), t.end(), k.begin());
    });
  };
  for (auto it = lru_.rbegin(); (nbytes_ > max_nbytes || entries_.size() > max_entries) && it != lru_.rend();) {
    auto entry = entries_.find(*it);
    if (kept(entry->second.tokens)) {
      ++it;
      continue;
    }
    nbytes_ -= entry->second.nbytes;
    entries_.erase(entry);
    it = std::make_reverse_iterator(lru_.erase(std::next(it).base()));
  }
  return nbytes_ <= max_nbytes && entries_.size() <= max_entries;
}

}  // namespace spw::runtime
