#include "ops/ref/engram_hash.h"

#include <cstdint>
#include <set>

#include "ops/ref/pcg64.h"

namespace spw::ref {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

std::vector<EngramHashParams> engram_hash_params(const std::vector<int>& layer_ids, int64_t engram_vocab_size,
                                                 int64_t compressed_vocab_size, int max_ngram, int n_heads) {
  std::vector<EngramHashParams> out;
  std::set<int64_t> used;
  const int64_t bound = (INT64_MAX / compressed_vocab_size) / 2;
  for (int layer : layer_ids) {
    EngramHashParams p;
    p.max_ngram = max_ngram;
    p.n_heads = n_heads;
    int64_t offset = 0;
    for (int n = 2; n <= max_ngram; ++n) {
      std::vector<int64_t> primes, offsets;
      int64_t candidate = engram_vocab_size - 1;
      for (int h = 0; h < n_heads; ++h) {
        do {
          ++candidate;
        } while (!is_prime(candidate) || used.count(candidate));
        used.insert(candidate);
        primes.push_back(candidate);
        offsets.push_back(offset);
        offset += candidate;
      }
      p.primes.push_back(primes);
      p.offsets.push_back(offsets);
    }
    p.n_rows = offset;
    NumpyPcg64 rng(uint64_t(10007) * uint64_t(layer));
    for (int64_t v : rng.integers(bound, max_ngram)) p.multipliers.push_back(v * 2 + 1);
    out.push_back(std::move(p));
  }
  return out;
}

void engram_rows(const EngramHashParams& p, const int64_t* history, int64_t* rows) {
  // Once a shift runs before the start or hits DEAD, it and every larger shift become pad.
  std::vector<int64_t> tau(p.max_ngram);
  bool cut = false;
  for (int i = 0; i < p.max_ngram; ++i) {
    if (history[i] < 0) cut = true;
    tau[i] = cut ? p.pad_id : history[i];
  }
  int64_t v = tau[0] * p.multipliers[0];
  for (int n = 1; n < p.max_ngram; ++n) {
    v ^= tau[n] * p.multipliers[n];
    for (int h = 0; h < p.n_heads; ++h)
      rows[(n - 1) * p.n_heads + h] = v % p.primes[n - 1][h] + p.offsets[n - 1][h];
  }
}

}  // namespace spw::ref
