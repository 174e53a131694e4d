// Random EXL3 tensors for the CPU kernel tests: any trellis bit pattern is valid, so random words with
// random fp16 factors make a tensor of any shape, bit width and codebook.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "formats/exl3.h"

namespace spw::test {

struct OwnedExl3 {
  std::vector<uint16_t> trellis;
  Exl3Tensor t;
};

// Draws, in this order: the trellis words, suh ~ su_scale·N(0, 1), svh ~ ±(1 + 0.2·N(0, 1)), and with
// `bias` a bias ~ 0.1·N(0, 1).
inline void fill_random_exl3(OwnedExl3& o, int64_t k, int64_t n, int k_x2, Exl3Codebook cb, std::mt19937& rng,
                             float su_scale, bool bias) {
  o.t.name = "random";
  o.t.k = k;
  o.t.n = n;
  o.t.bits.k_x2 = k_x2;
  o.t.codebook = cb;
  o.trellis.resize(static_cast<size_t>(k / 16) * (n / 16) * o.t.bits.words_per_tile());
  for (auto& w : o.trellis) w = rng() & 0xffff;
  o.t.trellis = o.trellis.data();
  std::normal_distribution<float> nd(0, 1);
  o.t.suh.resize(k);
  o.t.svh.resize(n);
  for (auto& v : o.t.suh) v = exl3_f64_to_f16(su_scale * nd(rng));
  for (auto& v : o.t.svh) v = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * (1 + 0.2 * nd(rng)));
  o.t.bias.clear();
  if (bias) {
    o.t.bias.resize(n);
    for (auto& v : o.t.bias) v = exl3_f64_to_f16(0.1 * nd(rng));
  }
}

}  // namespace spw::test
