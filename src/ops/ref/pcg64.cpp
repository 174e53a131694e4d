#include "ops/ref/pcg64.h"

#include <array>
#include <cstddef>

namespace spw::ref {
namespace {

// numpy SeedSequence constants (bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16, kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  return r ^ (r >> kXShift);
}

// SeedSequence(seed).generate_state(4, uint64).
std::array<uint64_t, 4> seed_sequence_state(uint64_t seed) {
  std::vector<uint32_t> entropy;
  do {
    entropy.push_back(uint32_t(seed));
    seed >>= 32;
  } while (seed != 0);
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(i < int(entropy.size()) ? entropy[i] : 0u, hash_const);
  for (int src = 0; src < kPoolSize; ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));

  std::array<uint32_t, 8> words{};
  uint32_t hb = kInitB;
  for (int i = 0; i < 8; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> kXShift;
    words[i] = v;
  }
  std::array<uint64_t, 4> out{};
  for (int i = 0; i < 4; ++i) out[i] = uint64_t(words[2 * i]) | (uint64_t(words[2 * i + 1]) << 32);
  return out;
}

constexpr unsigned __int128 kPcgMult =
    (unsigned __int128)(0x2360ED051FC65DA4ULL) << 64 | (unsigned __int128)(0x4385DF649FCCF645ULL);

}  // namespace

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  auto s = seed_sequence_state(seed);
  unsigned __int128 init_state = (unsigned __int128)s[0] << 64 | s[1];
  unsigned __int128 init_seq = (unsigned __int128)s[2] << 64 | s[3];
  state_ = 0;
  inc_ = (init_seq << 1) | 1;
  state_ = state_ * kPcgMult + inc_;
  state_ += init_state;
  state_ = state_ * kPcgMult + inc_;
}

uint64_t NumpyPcg64::next_u64() {
  state_ = state_ * kPcgMult + inc_;
  uint64_t x = uint64_t(state_ >> 64) ^ uint64_t(state_);
  unsigned rot = unsigned(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

std::vector<int64_t> NumpyPcg64::integers(int64_t high, int n) {
  const uint64_t rng_excl = uint64_t(high);  // numpy: rng = high − 1, rng_excl = rng + 1
  std::vector<int64_t> out(n);
  for (int i = 0; i < n; ++i) {
    unsigned __int128 m = (unsigned __int128)next_u64() * rng_excl;
    uint64_t leftover = uint64_t(m);
    if (leftover < rng_excl) {
      const uint64_t threshold = (UINT64_MAX - (rng_excl - 1)) % rng_excl;
      while (leftover < threshold) {
        m = (unsigned __int128)next_u64() * rng_excl;
        leftover = uint64_t(m);
      }
    }
    out[i] = int64_t(m >> 64);
  }
  return out;
}

}  // namespace spw::ref
