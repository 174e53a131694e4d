// V4.1 Engram n-gram hashing (specs §5.4): constants derived from the config, and the per-token
// table row ids. Token ids are first mapped to "compressed" ids (a many-to-one class map built
// from the tokenizer); DEAD (−1) marks positions that never hash (image tokens).
#pragma once

#include <cstdint>
#include <vector>

namespace spw::ref {

// History values that are not compressed ids: a position that never hashes (an image position) and one
// before the sequence's start.
inline constexpr int64_t kEngramDead = -1;
inline constexpr int64_t kEngramBeforeStart = -2;

struct EngramHashParams {
  int max_ngram = 4;          // n-grams of size 2..max_ngram
  int n_heads = 8;            // hash heads per n-gram size
  int64_t pad_id = 0;         // the compressed id of the pad token
  // Per n-gram size (2..max_ngram), per head: modulus and row offset into the layer's table.
  std::vector<std::vector<int64_t>> primes, offsets;
  std::vector<int64_t> multipliers;  // [max_ngram], odd
  int64_t n_rows = 0;                // table rows (sum of primes)
};

// Primes for all Engram layers in order (layer, n-gram size, head): the next primes above
// vocab_size − 1, never reused, restarting the search at vocab_size for each n-gram size.
// Returns one EngramHashParams per layer (pad_id left 0 for the caller).
std::vector<EngramHashParams> engram_hash_params(const std::vector<int>& layer_ids, int64_t engram_vocab_size,
                                                 int64_t compressed_vocab_size, int max_ngram, int n_heads);

bool is_prime(int64_t n);

// rows[(max_ngram−1)·n_heads] for the token at `pos`, from compressed ids of positions
// pos−max_ngram+1 .. pos (history[i] = id at pos−i, i = 0..max_ngram−1; −2 = before the start,
// −1 = DEAD). Order: 2-gram heads 0..n_heads−1, then 3-gram, ...
void engram_rows(const EngramHashParams& p, const int64_t* history, int64_t* rows);

}  // namespace spw::ref
