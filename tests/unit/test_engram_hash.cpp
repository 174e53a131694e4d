// Tests for ops/ref/pcg64.h (numpy default_rng reimplementation) and ops/ref/engram_hash.h
// (V4.1 Engram constants and row ids, specs §5.4). The real-config numbers are the spec's
// (derived there with an independent PCG64 and checked against the checkpoint's declared
// engram_num_embeddings); extra numpy draws were produced with numpy 2.4.6 (see each comment).
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "ops/ref/engram_hash.h"
#include "ops/ref/pcg64.h"

namespace spw::ref {
namespace {

// The real DeepSeek-V4.1-Flash configuration (specs §1.2).
constexpr int64_t kVocab = 16000000, kCompressed = 99092;
constexpr int kMaxNgram = 4, kHeads = 8;

std::vector<EngramHashParams> real_params() {
  return engram_hash_params({1, 14}, kVocab, kCompressed, kMaxNgram, kHeads);
}

TEST(NumpyPcg64, MatchesNumpyIntegers) {
  // numpy 2.4.6: list(np.random.default_rng(12345).integers(0, 2**50, 4))
  EXPECT_EQ(NumpyPcg64(12345).integers(int64_t(1) << 50, 4),
            (std::vector<int64_t>{255957606517759, 356638185170835, 897753694130451, 761395070800411}));
  // numpy 2.4.6: list(np.random.default_rng(0).integers(0, 2**40, 3))
  EXPECT_EQ(NumpyPcg64(0).integers(int64_t(1) << 40, 3),
            (std::vector<int64_t>{700346781657, 296633628802, 45050865998}));
  // A seed wider than 32 bits takes SeedSequence's multi-word entropy path.
  // numpy 2.4.6: list(np.random.default_rng(2**40 + 7).integers(0, 2**62, 3))
  EXPECT_EQ(NumpyPcg64((uint64_t(1) << 40) + 7).integers(int64_t(1) << 62, 3),
            (std::vector<int64_t>{3826836511160502378, 1177387229190954397, 709234494063162081}));
}

TEST(NumpyPcg64, MatchesNumpyRawOutput) {
  // numpy 2.4.6: g = np.random.PCG64(12345); [g.random_raw() for _ in range(3)]
  NumpyPcg64 a(12345);
  EXPECT_EQ(a.next_u64(), 4193609425186963869ull);
  EXPECT_EQ(a.next_u64(), 5843160025838961886ull);
  EXPECT_EQ(a.next_u64(), 14708796524633321433ull);
  // numpy 2.4.6: g = np.random.PCG64(10007); [g.random_raw() for _ in range(2)]  (layer 1's seed)
  NumpyPcg64 b(10007);
  EXPECT_EQ(b.next_u64(), 15187255322829266483ull);
  EXPECT_EQ(b.next_u64(), 959186003677246517ull);
}

TEST(EngramHashParams, RealConfigMultipliers) {
  // specs §5.4 item 3: default_rng(10007·layer).integers(0, B, 4)·2 + 1, B = (2^63−1) div 99092 div 2.
  auto p = real_params();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].multipliers,
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(p[1].multipliers,
            (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  for (const auto& lp : p)
    for (int64_t m : lp.multipliers) {
      EXPECT_EQ(m % 2, 1) << "multipliers are odd";
      // τ·m never overflows int64 for τ < compressed vocab (the reason for the bound B).
      EXPECT_LT(m, INT64_MAX / kCompressed);
    }
}

TEST(EngramHashParams, RealConfigPrimesOffsetsAndRows) {
  auto p = real_params();
  ASSERT_EQ(p.size(), 2u);
  for (const auto& lp : p) {
    EXPECT_EQ(lp.max_ngram, 4);
    EXPECT_EQ(lp.n_heads, 8);
    ASSERT_EQ(lp.primes.size(), 3u);
    ASSERT_EQ(lp.offsets.size(), 3u);
    for (size_t n = 0; n < 3; ++n) {
      ASSERT_EQ(lp.primes[n].size(), 8u);
      ASSERT_EQ(lp.offsets[n].size(), 8u);
    }
  }
  // specs §5.4 item 5: layer 1 starts 16000057, 16000079, 16000081; layer 14 ends 16000877, 16000879, 16000889.
  EXPECT_EQ(p[0].primes[0][0], 16000057);
  EXPECT_EQ(p[0].primes[0][1], 16000079);
  EXPECT_EQ(p[0].primes[0][2], 16000081);
  EXPECT_EQ(p[1].primes[2][5], 16000877);
  EXPECT_EQ(p[1].primes[2][6], 16000879);
  EXPECT_EQ(p[1].primes[2][7], 16000889);
  // The full lists (independent trial-division script, Python): the boundaries between n-gram
  // sizes and layers, where "never reused" and "restart at vocab_size" matter.
  EXPECT_EQ(p[0].primes[0][7], 16000183);
  EXPECT_EQ(p[0].primes[1][0], 16000189);
  EXPECT_EQ(p[0].primes[2][7], 16000463);
  EXPECT_EQ(p[1].primes[0][0], 16000477);
  // specs §1.2 engram_num_embeddings.
  EXPECT_EQ(p[0].n_rows, 384006168);
  EXPECT_EQ(p[1].n_rows, 384016682);
  // Offsets are the running sum within a layer; primes strictly increase, all distinct, all prime.
  std::vector<int64_t> all;
  for (const auto& lp : p) {
    int64_t running = 0;
    for (size_t n = 0; n < 3; ++n)
      for (size_t h = 0; h < 8; ++h) {
        EXPECT_EQ(lp.offsets[n][h], running);
        running += lp.primes[n][h];
        EXPECT_TRUE(is_prime(lp.primes[n][h]));
        EXPECT_GE(lp.primes[n][h], kVocab);
        all.push_back(lp.primes[n][h]);
      }
    EXPECT_EQ(running, lp.n_rows);
  }
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LT(all[i - 1], all[i]) << "primes reused or out of order at " << i;
}

TEST(EngramHashParams, IsPrimeSmallCases) {
  EXPECT_FALSE(is_prime(-7));
  EXPECT_FALSE(is_prime(0));
  EXPECT_FALSE(is_prime(1));
  EXPECT_TRUE(is_prime(2));
  EXPECT_TRUE(is_prime(3));
  EXPECT_FALSE(is_prime(4));
  EXPECT_FALSE(is_prime(16000001));  // = 109 · 229 · 641
  EXPECT_TRUE(is_prime(16000057));
  EXPECT_FALSE(is_prime(16000057LL * 3));
  EXPECT_FALSE(is_prime(4001LL * 4001));  // square of a prime: the d·d <= n bound must include equality
}

TEST(EngramHashParams, TinyFixtureConfigMatchesDeclaredRows) {
  // tests/golden/fixtures/v41/model/config.json: layers [1, 4], engram_vocab_size 1000,
  // compressed vocab 522, max_ngram 4, 2 heads → engram_num_embeddings [6126, 6332].
  auto p = engram_hash_params({1, 4}, 1000, 522, 4, 2);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].n_rows, 6126);
  EXPECT_EQ(p[1].n_rows, 6332);
  // First primes above 999: 1009, 1013 (2-gram), then 1019, 1021 (3-gram), 1031, 1033 (4-gram).
  EXPECT_EQ(p[0].primes, (std::vector<std::vector<int64_t>>{{1009, 1013}, {1019, 1021}, {1031, 1033}}));
  // Layer 4 continues after layer 1's primes (never reused).
  EXPECT_EQ(p[1].primes, (std::vector<std::vector<int64_t>>{{1039, 1049}, {1051, 1061}, {1063, 1069}}));
}

// Independent reading of specs §5.4 items 2 and 4 for the expected rows.
std::vector<int64_t> rows_reference(const EngramHashParams& p, const std::vector<int64_t>& history) {
  std::vector<int64_t> tau;
  bool cut = false;
  for (int64_t h : history) {
    cut = cut || h < 0;
    tau.push_back(cut ? p.pad_id : h);
  }
  std::vector<int64_t> out;
  int64_t v = tau[0] * p.multipliers[0];
  for (int n = 1; n < p.max_ngram; ++n) {
    v ^= tau[n] * p.multipliers[n];
    for (int h = 0; h < p.n_heads; ++h) out.push_back(v % p.primes[n - 1][h] + p.offsets[n - 1][h]);
  }
  return out;
}

std::vector<int64_t> rows_of(const EngramHashParams& p, const std::vector<int64_t>& history) {
  std::vector<int64_t> rows((p.max_ngram - 1) * p.n_heads, -999);
  engram_rows(p, history.data(), rows.data());
  return rows;
}

TEST(EngramRows, RealConfigHandComputedValues) {
  auto p = real_params();
  p[0].pad_id = 7;
  // Python (big integers, so no overflow question): history [5, 17, 99091, 3] for layer 1, pad 7.
  EXPECT_EQ(rows_of(p[0], {5, 17, 99091, 3}),
            (std::vector<int64_t>{3889985,   30570021,  40268302,  53854578,  74235168,  81029010,
                                  100426120, 118891433, 143562967, 153520896, 165847521, 186163984,
                                  201532732, 215229454, 227289662, 255349519, 260886967, 284544904,
                                  288894083, 316572364, 330247793, 343595791, 366067695, 380817239}));
  // DEAD at shift 2: shifts 2 and 3 become pad (7); the 2-gram rows are unchanged.
  EXPECT_EQ(rows_of(p[0], {5, 17, -1, 3}),
            (std::vector<int64_t>{3889985,   30570021,  40268302,  53854578,  74235168,  81029010,
                                  100426120, 118891433, 132877802, 156578934, 163623845, 181598830,
                                  207873935, 213012285, 236721269, 253384758, 268870909, 273258068,
                                  290512031, 307139233, 328890979, 345518213, 360155348, 383161088}));
  // The first token of a sequence: shifts 1..3 are before the start (−2) → pad.
  EXPECT_EQ(rows_of(p[0], {5, -2, -2, -2}),
            (std::vector<int64_t>{6961830,   31143904,  34796895,  48021142,  75858929,  90471933,
                                  97778503,  125113896, 138376174, 144067429, 171999328, 185284145,
                                  192878349, 212676520, 234374640, 244140534, 266485882, 275482849,
                                  294054116, 311340006, 328197423, 345483383, 353626042, 373055409}));
}

TEST(EngramRows, PadRuleMatchesIndependentReading) {
  auto p = real_params();
  for (auto& lp : p) lp.pad_id = 1234;
  const std::vector<std::vector<int64_t>> histories = {
      {0, 0, 0, 0},
      {99091, 99091, 99091, 99091},
      {42, -2, 17, 18},  // a real-looking id after the cut is still pad
      {42, 17, -2, -2},
      {42, 17, 18, -2},
      {-1, 5, 6, 7},  // DEAD at the current position: every shift is pad
      {42, -1, 6, 7},
      {42, 17, 18, -1}};
  for (const auto& lp : p)
    for (const auto& h : histories) EXPECT_EQ(rows_of(lp, h), rows_reference(lp, h)) << h[0] << "," << h[1] << "," << h[2] << "," << h[3];
  // Equivalences the rule implies: once cut, whatever follows is pad.
  EXPECT_EQ(rows_of(p[0], {42, -2, 17, 18}), rows_of(p[0], {42, 1234, 1234, 1234}));
  EXPECT_EQ(rows_of(p[0], {42, 17, -1, 5}), rows_of(p[0], {42, 17, -2, -2}));
  EXPECT_NE(rows_of(p[0], {42, 17, 18, 19}), rows_of(p[0], {42, 17, 18, -2}));
}

TEST(EngramRows, RowsLieInTheirHeadsRange) {
  auto p = real_params();
  p[1].pad_id = 2;
  uint64_t state = 88172645463325252ull;  // xorshift64 for random compressed ids
  auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> h(4);
    for (auto& v : h) {
      const uint64_t r = next();
      v = (r % 16 == 0) ? -1 : (r % 16 == 1) ? -2 : int64_t(r % kCompressed);
    }
    for (const auto& lp : p) {
      auto rows = rows_of(lp, h);
      for (int n = 0; n < 3; ++n)
        for (int k = 0; k < 8; ++k) {
          const int64_t r = rows[n * 8 + k];
          ASSERT_GE(r, lp.offsets[n][k]);
          ASSERT_LT(r, lp.offsets[n][k] + lp.primes[n][k]);
          ASSERT_LT(r, lp.n_rows);
        }
    }
  }
}

}  // namespace
}  // namespace spw::ref
