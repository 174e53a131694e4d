// EXL3 trellis search and packing (src/quantize/trellis_encode.h): the Viterbi is exact on short
// trellises (checked against exhaustive search), tiles close the ring, and packed words decode
// through the reader (src/formats/exl3) to exactly the states and values the encoder chose.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "formats/exl3.h"
#include "quantize/trellis_encode.h"

namespace spw::quant {
namespace {

double path_cost(const float* lut, const float* t, const std::vector<uint16_t>& st) {
  double e = 0;
  for (size_t p = 0; p < st.size(); ++p) e += (double(lut[st[p]]) - t[p]) * (double(lut[st[p]]) - t[p]);
  return e;
}

// Exhaustive: every start state s0 (constrained or not), then every choice of K new bits per step.
double brute_force(const float* lut, const float* t, int n, int k, int start_edge, int end_edge) {
  const uint32_t mask = (1u << (16 - k)) - 1;
  double best = std::numeric_limits<double>::infinity();
  const uint64_t n_tails = uint64_t(1) << (k * (n - 1));
  for (uint32_t s0 = 0; s0 < 65536; ++s0) {
    if (start_edge >= 0 && int(s0 >> k) != start_edge) continue;
    for (uint64_t tail = 0; tail < n_tails; ++tail) {
      uint32_t s = s0;
      double e = (double(lut[s]) - t[0]) * (double(lut[s]) - t[0]);
      for (int p = 1; p < n; ++p) {
        const uint32_t bits = uint32_t(tail >> (k * (p - 1))) & ((1u << k) - 1);
        s = ((s << k) | bits) & 0xffff;
        e += (double(lut[s]) - t[p]) * (double(lut[s]) - t[p]);
      }
      if (end_edge >= 0 && int(s & mask) != end_edge) continue;
      best = std::min(best, e);
    }
  }
  return best;
}

TEST(Exl3QuantizeTrellis, ViterbiMatchesExhaustiveSearch) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.2f);
  struct Case { int k, n, start, end; Exl3Codebook cb; };
  const Case cases[] = {
      {2, 3, -1, -1, Exl3Codebook::kMul1}, {3, 2, -1, -1, Exl3Codebook::k3Inst}, {1, 5, -1, -1, Exl3Codebook::kMcg},
      {2, 6, 1234, -1, Exl3Codebook::k3Inst}, {4, 4, 77, -1, Exl3Codebook::kMul1}, {2, 8, 999, 5000, Exl3Codebook::kMcg},
      {1, 12, 4321, 17, Exl3Codebook::kMul1}, {3, 5, 4000, 100, Exl3Codebook::kMul1},
  };
  for (const Case& c : cases) {
    std::vector<float> t(size_t(c.n));
    for (auto& v : t) v = nd(rng);
    TrellisEncoder enc(c.k, c.cb);
    std::vector<uint16_t> st(size_t(c.n));
    const double got = enc.viterbi(t.data(), c.n, c.start, c.end, st.data());
    const double want = brute_force(exl3_codebook_lut_f32(c.cb), t.data(), c.n, c.k, c.start, c.end);
    SCOPED_TRACE("K=" + std::to_string(c.k) + " n=" + std::to_string(c.n) + " start=" + std::to_string(c.start));
    if (std::isinf(want)) {
      EXPECT_TRUE(std::isinf(got));
      continue;
    }
    EXPECT_NEAR(got, want, 1e-5 * (1 + want));
    EXPECT_NEAR(path_cost(exl3_codebook_lut_f32(c.cb), t.data(), st), got, 1e-9);
    for (int p = 1; p < c.n; ++p) EXPECT_EQ(st[size_t(p)] >> c.k, st[size_t(p - 1)] & ((1u << (16 - c.k)) - 1));
    if (c.start >= 0) { EXPECT_EQ(st[0] >> c.k, c.start); }
    if (c.end >= 0) { EXPECT_EQ(int(st.back() & ((1u << (16 - c.k)) - 1)), c.end); }
  }
}

// Encode random tiles, pack, read the words back with the reader's state extraction and decode:
// states and fp16 values must equal the encoder's own, for every K and codebook.
TEST(Exl3QuantizeTrellis, PackedTilesDecodeBitExactly) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int cbi = 0; cbi < 3; ++cbi)
    for (int k = 1; k <= 8; ++k) {
      const auto cb = Exl3Codebook(cbi);
      TrellisEncoder enc(k, cb);
      float tile[256], dec[256];
      for (auto& v : tile) v = nd(rng);
      std::vector<uint16_t> words(size_t(16 * k));
      const double err = enc.encode_tile_rowmajor(tile, words.data(), dec);
      uint16_t ref[256];
      Exl3Bits bits;
      bits.k_x2 = 2 * k;
      exl3_decode_tile(words.data(), bits, cb, ref);
      double err2 = 0;
      for (int i = 0; i < 256; ++i) {
        ASSERT_EQ(exl3_f16_to_f32(ref[i]), dec[i]) << "K=" << k << " cb=" << cbi << " i=" << i;
        err2 += (double(dec[i]) - tile[i]) * (double(dec[i]) - tile[i]);
      }
      EXPECT_NEAR(err, err2, 1e-6 * err2);
      // Normalized MSE near the spec's measured rates (§4.4), loose: one tile, unscaled input.
      EXPECT_LT(err2 / 256, 2.5 * std::pow(4.0, -k) + 0.02) << "K=" << k;
    }
}

TEST(Exl3QuantizeTrellis, TileStatesCloseTheRing) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int k : {2, 3, 5}) {
    TrellisEncoder enc(k, Exl3Codebook::kMcg);
    float t[256];
    for (auto& v : t) v = nd(rng);
    uint16_t st[256], back[256];
    enc.encode_tile(t, st);
    std::vector<uint16_t> words(size_t(16 * k));
    exl3_pack_tile(st, k, words.data());
    Exl3Bits bits;
    bits.k_x2 = 2 * k;
    exl3_tile_states(words.data(), bits, back);
    for (int p = 0; p < 256; ++p) ASSERT_EQ(st[p], back[p]) << "K=" << k << " p=" << p;
  }
}

}  // namespace
}  // namespace spw::quant
