#include "runtime/ngram_drafter.h"

#include <algorithm>
#include <cstring>

namespace spw::runtime {

NgramDrafter::NgramDrafter(NgramSettings settings) : settings_(settings) {
  settings_.min_ngram = std::max(1, settings_.min_ngram);
  settings_.max_ngram = std::max(settings_.min_ngram, settings_.max_ngram);
}

uint64_t NgramDrafter::key(const int32_t* tokens) const {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < settings_.min_ngram; ++i) {
    h ^= uint64_t(uint32_t(tokens[i])) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h;
}

std::vector<int32_t> NgramDrafter::propose(std::span<const int32_t> context, int max_tokens) {
  const int64_t L = int64_t(context.size()), n = settings_.min_ngram;
  const int32_t* c = context.data();
  // Index every occurrence that ends before the tail (the tail itself is what is looked up).
  for (int64_t e = std::max<int64_t>(indexed_end_, n); e < L; ++e) follows_[key(c + e - n)].push_back(e);
  indexed_end_ = std::max(indexed_end_, L);
  if (max_tokens <= 0 || L <= n) return {};
  const auto it = follows_.find(key(c + L - n));
  if (it == follows_.end()) return {};

  int64_t best = -1;
  int best_len = 0;
  const std::vector<int64_t>& ends = it->second;
  const size_t first = ends.size() > size_t(kCandidates) ? ends.size() - size_t(kCandidates) : 0;
  for (size_t i = ends.size(); i-- > first;) {
    const int64_t e = ends[i];
    if (std::memcmp(c + e - n, c + L - n, sizeof(int32_t) * size_t(n)) != 0) continue;  // a key collision
    int len = int(n);
    while (len < settings_.max_ngram && e - len - 1 >= 0 && c[e - len - 1] == c[L - len - 1]) ++len;
    if (len > best_len) {
      best = e;
      best_len = len;
      if (len == settings_.max_ngram) break;
    }
  }
  if (best < 0) return {};
  const int64_t end = std::min<int64_t>(L, best + max_tokens);
  return std::vector<int32_t>(c + best, c + end);
}

}  // namespace spw::runtime
