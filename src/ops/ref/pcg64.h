// numpy's default_rng: SeedSequence → PCG64 (XSL-RR 128/64) → Generator.integers (Lemire).
// Needed bit-exactly because V4.1's Engram multipliers are drawn with
// numpy.random.default_rng(10007·layer_id).integers(0, B, n) (specs §5.4).
// Tests: tests/unit/test_engram_hash.cpp checks the multipliers the spec quotes.
#pragma once

#include <cstdint>
#include <vector>

namespace spw::ref {

class NumpyPcg64 {
 public:
  explicit NumpyPcg64(uint64_t seed);
  uint64_t next_u64();
  // Generator.integers(0, high, n) for int64 with high > 2^32 (the Lemire path numpy takes there).
  std::vector<int64_t> integers(int64_t high, int n);

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
};

}  // namespace spw::ref
