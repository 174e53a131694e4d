// Tests for the plain CPU references in src/ops/ref (linalg, rope, hyper_connection, attention,
// hadamard, topk, moe). Each op is checked against an independent double-precision formulation
// written here from specs/deepseek-v4.md §3-§4, on odd shapes, plus hand-checkable cases whose
// expected values are worked out in the comments. Tolerances state their reason next to them.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "formats/dtypes.h"
#include "ops/ref/attention.h"
#include "ops/ref/hadamard.h"
#include "ops/ref/hyper_connection.h"
#include "ops/ref/linalg.h"
#include "ops/ref/moe.h"
#include "ops/ref/rope.h"
#include "ops/ref/topk.h"

namespace spw::ref {
namespace {

constexpr double kF32Eps = 1.0 / (1 << 24);  // unit roundoff u of f32 (round to nearest)

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// ---------------------------------------------------------------------------------------------
// matmul_nt

struct MatmulShape {
  size_t n_tokens, n_in, n_out;
};

TEST(OpsRefMatmul, MatchesDoubleLoopOnOddShapes) {
  const size_t kGuard = 16;
  const float kSentinel = 12345.f;
  for (size_t n_tokens : {1, 7, 17, 127}) {
    for (auto [n_in, n_out] : {std::pair<size_t, size_t>{1, 3}, {33, 19}, {129, 65}, {257, 31}}) {
      SCOPED_TRACE(::testing::Message() << "n_tokens=" << n_tokens << " n_in=" << n_in << " n_out=" << n_out);
      auto x = random_floats(n_tokens * n_in, 1000 + unsigned(n_tokens * n_in));
      auto w = random_floats(n_out * n_in, 2000 + unsigned(n_out * n_in));
      // y is pre-filled with NaN (overwrite, not accumulate) and followed by a guard region.
      std::vector<float> y(n_tokens * n_out + kGuard, std::numeric_limits<float>::quiet_NaN());
      std::fill(y.begin() + n_tokens * n_out, y.end(), kSentinel);
      matmul_nt(x.data(), w.data(), y.data(), n_tokens, n_in, n_out);
      double max_err = 0;
      for (size_t t = 0; t < n_tokens; ++t)
        for (size_t o = 0; o < n_out; ++o) {
          double ref = 0, abs_sum = 0;
          for (size_t k = 0; k < n_in; ++k) {
            ref += double(x[t * n_in + k]) * w[o * n_in + k];
            abs_sum += std::fabs(double(x[t * n_in + k]) * w[o * n_in + k]);
          }
          // A sequential f32 dot product of n terms is within γ_n·Σ|x_k·w_k|, γ_n ≈ n·u
          // (Higham, Accuracy and Stability, §3.1); +1 for the product roundings.
          const double bound = double(n_in + 1) * kF32Eps * abs_sum + 1e-30;
          const double err = std::fabs(double(y[t * n_out + o]) - ref);
          ASSERT_LE(err, bound) << "t=" << t << " o=" << o;
          max_err = std::max(max_err, err);
        }
      for (size_t i = n_tokens * n_out; i < y.size(); ++i) ASSERT_EQ(y[i], kSentinel) << "guard overwritten at " << i;
    }
  }
}

// The contract the whole reference relies on (chunked prefill = one pass, calibration Hessians equal a plain
// forward's): every output is the sequential f32 sum in k order, a multiply and an add each rounded — exactly, not
// within a bound — whatever the token count (the few-token and the tiled paths), tile edges and thread split.
TEST(OpsRefMatmul, BitIdenticalToTheSequentialScalarSum) {
  for (size_t n_tokens : {1, 2, 3, 4, 5, 9, 64}) {
    for (auto [n_in, n_out] : {std::pair<size_t, size_t>{1, 1}, {3, 7}, {31, 33}, {257, 65}, {256, 130}}) {
      SCOPED_TRACE(::testing::Message() << "n_tokens=" << n_tokens << " n_in=" << n_in << " n_out=" << n_out);
      auto x = random_floats(n_tokens * n_in, 3000 + unsigned(n_tokens * n_in));
      auto w = random_floats(n_out * n_in, 4000 + unsigned(n_out * n_in));
      if (n_in > 2) x[1] = -0.f, w[2] = 0.f;  // signed zeros take the same path through the sum
      std::vector<float> y(n_tokens * n_out), y_serial(n_tokens * n_out);
      matmul_nt(x.data(), w.data(), y.data(), n_tokens, n_in, n_out);
      matmul_nt_serial(x.data(), w.data(), y_serial.data(), n_tokens, n_in, n_out);
      for (size_t t = 0; t < n_tokens; ++t)
        for (size_t o = 0; o < n_out; ++o) {
          volatile float acc = 0.f;  // volatile: one rounded multiply and one rounded add per step, as written
          for (size_t k = 0; k < n_in; ++k) {
            volatile float p = x[t * n_in + k] * w[o * n_in + k];
            acc = acc + p;
          }
          const float want = acc;
          ASSERT_EQ(std::memcmp(&y[t * n_out + o], &want, 4), 0) << "t=" << t << " o=" << o << ": " << y[t * n_out + o]
                                                                  << " vs " << want;
          ASSERT_EQ(std::memcmp(&y_serial[t * n_out + o], &want, 4), 0) << "serial t=" << t << " o=" << o;
        }
    }
  }
}

TEST(OpsRefMatmul, HandComputed) {
  // x = [[1, 2, 3]], w = [[1, 0, 0], [0, 1, 0], [1, 1, 1], [-1, 0.5, 2]] → y = [1, 2, 6, 6].
  const float x[] = {1, 2, 3};
  const float w[] = {1, 0, 0, 0, 1, 0, 1, 1, 1, -1, 0.5f, 2};
  float y[4];
  matmul_nt(x, w, y, 1, 3, 4);
  EXPECT_EQ(y[0], 1.f);
  EXPECT_EQ(y[1], 2.f);
  EXPECT_EQ(y[2], 6.f);
  EXPECT_EQ(y[3], 6.f);
}

// ---------------------------------------------------------------------------------------------
// rms_norm

void rms_norm_double(const float* x, const float* w, double* y, size_t n_rows, size_t d, double eps) {
  for (size_t r = 0; r < n_rows; ++r) {
    double ss = 0;
    for (size_t i = 0; i < d; ++i) ss += double(x[r * d + i]) * x[r * d + i];
    const double inv = 1.0 / std::sqrt(ss / double(d) + eps);
    for (size_t i = 0; i < d; ++i) y[r * d + i] = (w ? double(w[i]) : 1.0) * double(x[r * d + i]) * inv;
  }
}

TEST(OpsRefRmsNorm, MatchesDoubleWithAndWithoutWeight) {
  for (size_t n_rows : {1, 7, 17}) {
    for (size_t d : {1, 7, 127, 512}) {
      for (bool weighted : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "n_rows=" << n_rows << " d=" << d << " weighted=" << weighted);
        auto x = random_floats(n_rows * d, 7 + unsigned(n_rows * d), -3.f, 3.f);
        auto w = random_floats(d, 11 + unsigned(d), 0.5f, 2.f);
        std::vector<float> y(n_rows * d);
        std::vector<double> ref(n_rows * d);
        rms_norm(x.data(), weighted ? w.data() : nullptr, y.data(), n_rows, d, 1e-6f);
        rms_norm_double(x.data(), weighted ? w.data() : nullptr, ref.data(), n_rows, d, 1e-6);
        for (size_t i = 0; i < y.size(); ++i) {
          // The reference accumulates Σx² in double, then does ~5 f32 roundings (mean cast, +eps,
          // sqrt, reciprocal, two products): relative error ≤ ~6u; allow 8u.
          ASSERT_NEAR(y[i], ref[i], 8 * kF32Eps * std::fabs(ref[i]) + 1e-30) << "i=" << i;
        }
      }
    }
  }
}

TEST(OpsRefRmsNorm, InPlaceEqualsOutOfPlace) {
  const size_t n_rows = 7, d = 127;
  auto x = random_floats(n_rows * d, 99, -2.f, 2.f);
  auto w = random_floats(d, 100, 0.5f, 2.f);
  std::vector<float> out(n_rows * d), inplace = x;
  rms_norm(x.data(), w.data(), out.data(), n_rows, d, 1e-6f);
  rms_norm(inplace.data(), w.data(), inplace.data(), n_rows, d, 1e-6f);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], inplace[i]) << i;  // same arithmetic: bit-equal
}

TEST(OpsRefRmsNorm, HandComputedAndTinyEps) {
  // x = [3, 4]: mean(x²) = 12.5, rsqrt = 0.28284271; y = [0.8485281, 1.1313708].
  const float x[] = {3, 4};
  float y[2];
  rms_norm(x, nullptr, y, 1, 2, 0.f);
  EXPECT_NEAR(y[0], 3.0 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[1], 4.0 / std::sqrt(12.5), 1e-6);
  // V4.1 uses eps = 1e-20: a row with RMS 1e-8 must normalize to x/sqrt(x² + 1e-20) ≈ 0.99995, i.e.
  // no larger eps floor sneaks in (eps 1e-6 would give ≈ 1e-5).
  const float small[] = {1e-8f, -1e-8f};
  rms_norm(small, nullptr, y, 1, 2, 1e-20f);
  const double s0 = double(small[0]), expected = s0 / std::sqrt(s0 * s0 + double(1e-20f));
  EXPECT_NEAR(y[0], expected, 1e-6);
  EXPECT_NEAR(y[1], -expected, 1e-6);
  EXPECT_LT(y[0], 0.99999f);  // eps is honoured, not dropped
}

// ---------------------------------------------------------------------------------------------
// RoPE

TEST(OpsRefRope, PlainFrequenciesMatchFormula) {
  RopeParams p;
  p.base = 10000.f;
  p.d_rope = 64;
  auto f = rope_frequencies(p);
  ASSERT_EQ(f.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double theta = std::pow(10000.0, -2.0 * i / 64.0);
    // f32 pow/division vs double: a few ulps.
    EXPECT_NEAR(f[i], theta, 4 * kF32Eps * theta) << "i=" << i;
  }
}

TEST(OpsRefRope, YarnFrequenciesMatchSpecFormula) {
  // specs §3 RoPE: corr(r) = 64·ln(65536/(2πr))/(2·ln base); low = max(floor(corr(32)), 0),
  // high = min(ceil(corr(1)), 63); ramp_i = clamp((i−low)/(high−low), 0, 1);
  // θ'_i = θ_i/16·ramp_i + θ_i·(1−ramp_i). For base 160000 the spec derives low = 15, high = 25.
  RopeParams p;
  p.base = 160000.f;
  p.d_rope = 64;
  p.yarn = true;
  p.yarn_factor = 16.f;
  p.yarn_original_len = 65536;
  p.beta_fast = 32.f;
  p.beta_slow = 1.f;
  const double base = 160000.0;
  auto corr = [&](double r) { return 64.0 * std::log(65536.0 / (2 * std::numbers::pi * r)) / (2 * std::log(base)); };
  const double low = std::max(std::floor(corr(32)), 0.0), high = std::min(std::ceil(corr(1)), 63.0);
  ASSERT_EQ(low, 15.0);
  ASSERT_EQ(high, 25.0);
  auto f = rope_frequencies(p);
  ASSERT_EQ(f.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double theta = std::pow(base, -2.0 * i / 64.0);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double expected = theta / 16 * ramp + theta * (1 - ramp);
    EXPECT_NEAR(f[i], expected, 8 * kF32Eps * expected) << "i=" << i;  // f32 pow + blend: a few ulps
    if (i <= 15) {
      EXPECT_NEAR(f[i], theta, 4 * kF32Eps * theta) << "unchanged below low, i=" << i;
    }
    if (i >= 25) {
      EXPECT_NEAR(f[i], theta / 16, 4 * kF32Eps * theta / 16) << "divided by 16 above high, i=" << i;
    }
  }
  // Strictly inside the ramp the frequency is strictly between θ/16 and θ.
  const double theta20 = std::pow(base, -40.0 / 64.0);
  EXPECT_LT(f[20], theta20 * (1 - 1e-3));
  EXPECT_GT(f[20], theta20 / 16 * (1 + 1e-3));
}

TEST(OpsRefRope, RotatesOnlyLastChannelsInterleaved) {
  const size_t n_vectors = 3, d = 128;
  RopeParams p;
  p.base = 10000.f;
  p.d_rope = 64;
  auto freqs = rope_frequencies(p);
  auto x = random_floats(n_vectors * d, 5);
  auto y = x;
  const int64_t pos = 37;
  rope_apply(y.data(), n_vectors, d, freqs, pos, false);
  for (size_t v = 0; v < n_vectors; ++v) {
    for (size_t c = 0; c < d - 64; ++c) ASSERT_EQ(y[v * d + c], x[v * d + c]) << "nope channel changed: " << c;
    for (size_t i = 0; i < 32; ++i) {
      // Pair i = channels (2i, 2i+1) of the last 64; angle = pos·θ_i in f32 (specs §3).
      const float angle = float(pos) * freqs[i];
      const double c = std::cos(double(angle)), s = std::sin(double(angle));
      const double a = x[v * d + 64 + 2 * i], b = x[v * d + 64 + 2 * i + 1];
      // f32 cos/sin (≤1 ulp each) and two products plus a sum on |values| ≤ 1: ≤ ~1e-6.
      EXPECT_NEAR(y[v * d + 64 + 2 * i], a * c - b * s, 1e-6) << "v=" << v << " i=" << i;
      EXPECT_NEAR(y[v * d + 64 + 2 * i + 1], a * s + b * c, 1e-6) << "v=" << v << " i=" << i;
    }
  }
}

TEST(OpsRefRope, InverseUndoesForwardAndPreservesNorm) {
  const size_t n_vectors = 5, d = 512;
  RopeParams p;
  p.base = 160000.f;
  p.yarn = true;
  auto freqs = rope_frequencies(p);
  for (int64_t pos : {int64_t(0), int64_t(1), int64_t(127), int64_t(65537), int64_t(1) << 20}) {
    auto x = random_floats(n_vectors * d, 17 + unsigned(pos));
    auto y = x;
    rope_apply(y.data(), n_vectors, d, freqs, pos, false);
    double n0 = 0, n1 = 0;
    for (size_t i = 0; i < x.size(); ++i) n0 += double(x[i]) * x[i], n1 += double(y[i]) * y[i];
    EXPECT_NEAR(n1, n0, 1e-5 * n0) << "rotation changes the norm, pos=" << pos;
    rope_apply(y.data(), n_vectors, d, freqs, pos, true);
    // Rotating by +a then by −a in f32 (same cos/sin values): error ≈ 2 roundings per step on |x| ≤ 1.
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-6) << "pos=" << pos << " i=" << i;
  }
}

TEST(OpsRefRope, PositionZeroIsIdentity) {
  RopeParams p;
  auto freqs = rope_frequencies(p);
  auto x = random_floats(128, 3);
  auto y = x;
  rope_apply(y.data(), 1, 128, freqs, 0, false);
  EXPECT_EQ(x, y);  // cos 0 = 1, sin 0 = 0 exactly
}

// ---------------------------------------------------------------------------------------------
// mHC

// Independent double transcription of specs §3 "mHC coefficients".
struct HcDouble {
  std::vector<double> pre, post, comb;
};
HcDouble hc_split_sinkhorn_double(const std::vector<float>& mixes, const float* scale, const std::vector<float>& base,
                                  int hc, int iters, double eps) {
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  HcDouble r;
  for (int j = 0; j < hc; ++j) {
    r.pre.push_back(sig(mixes[j] * double(scale[0]) + base[j]) + eps);
    r.post.push_back(2 * sig(mixes[hc + j] * double(scale[1]) + base[hc + j]));
  }
  std::vector<double> C(hc * hc);
  for (int j = 0; j < hc; ++j) {
    double mx = -INFINITY, sum = 0;
    for (int k = 0; k < hc; ++k) {
      C[j * hc + k] = mixes[2 * hc + j * hc + k] * double(scale[2]) + base[2 * hc + j * hc + k];
      mx = std::max(mx, C[j * hc + k]);
    }
    for (int k = 0; k < hc; ++k) sum += std::exp(C[j * hc + k] - mx);
    for (int k = 0; k < hc; ++k) C[j * hc + k] = std::exp(C[j * hc + k] - mx) / sum + eps;
  }
  auto cols = [&] {
    for (int k = 0; k < hc; ++k) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += C[j * hc + k];
      for (int j = 0; j < hc; ++j) C[j * hc + k] /= s + eps;
    }
  };
  auto rows = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = 0;
      for (int k = 0; k < hc; ++k) s += C[j * hc + k];
      for (int k = 0; k < hc; ++k) C[j * hc + k] /= s + eps;
    }
  };
  cols();
  for (int it = 1; it < iters; ++it) rows(), cols();
  r.comb = C;
  return r;
}

TEST(OpsRefHc, SinkhornMatchesDoubleAndIsNearlyDoublyStochastic) {
  const int hc = 4, n_mix = (2 + hc) * hc;
  for (uint32_t seed : {1u, 2u, 3u}) {
    auto mixes = random_floats(n_mix, seed, -3.f, 3.f);
    auto base = random_floats(n_mix, seed + 10, -1.f, 1.f);
    const float scale[3] = {0.7f, 1.3f, 2.0f};
    auto c = hc_split_sinkhorn(mixes.data(), scale, base.data(), hc, 20, 1e-6f);
    auto r = hc_split_sinkhorn_double(mixes, scale, base, hc, 20, 1e-6);
    ASSERT_EQ(c.pre.size(), 4u);
    ASSERT_EQ(c.post.size(), 4u);
    ASSERT_EQ(c.comb.size(), 16u);
    for (int j = 0; j < hc; ++j) {
      // f32 exp/division vs double on values O(1): ~1e-6 relative after 39 normalization passes.
      EXPECT_NEAR(c.pre[j], r.pre[j], 1e-6);
      EXPECT_NEAR(c.post[j], r.post[j], 2e-6);
      // pre ∈ (hc_eps, 1 + hc_eps), post ∈ (0, 2).
      EXPECT_GT(c.pre[j], 1e-6f);
      EXPECT_LT(c.pre[j], 1.f + 2e-6f);
      EXPECT_GT(c.post[j], 0.f);
      EXPECT_LT(c.post[j], 2.f);
    }
    for (int i = 0; i < hc * hc; ++i) {
      EXPECT_NEAR(c.comb[i], r.comb[i], 1e-5) << "seed=" << seed << " i=" << i;
      EXPECT_GT(c.comb[i], 0.f);
    }
    for (int k = 0; k < hc; ++k) {
      double col = 0, row = 0;
      for (int j = 0; j < hc; ++j) col += c.comb[j * hc + k], row += c.comb[k * hc + j];
      // The last pass normalizes columns: they sum to s/(s+eps) = 1 − O(1e-6), plus f32 rounding.
      EXPECT_NEAR(col, 1.0, 1e-5) << "column " << k;
      // 19 row/column rounds of Sinkhorn on a positive 4×4 matrix with entries spanning e^±8:
      // rows converge to 1 within 1e-3 (measured with the double reference: ≤ 1e-5).
      EXPECT_NEAR(row, 1.0, 1e-3) << "row " << k;
    }
  }
}

TEST(OpsRefHc, SinkhornHandCheckable) {
  // All mixes and bases zero: pre = σ(0) + eps = 0.5 + 1e-6, post = 2σ(0) = 1, and every comb row
  // is a uniform softmax (1/hc + eps), which the normalizations keep uniform: comb = 1/hc (to 1e-6).
  for (int hc : {1, 2, 4}) {
    std::vector<float> mixes((2 + hc) * hc, 0.f), base((2 + hc) * hc, 0.f);
    const float scale[3] = {1.f, 1.f, 1.f};
    auto c = hc_split_sinkhorn(mixes.data(), scale, base.data(), hc, 20, 1e-6f);
    for (int j = 0; j < hc; ++j) {
      EXPECT_NEAR(c.pre[j], 0.500001f, 1e-7f);
      EXPECT_FLOAT_EQ(c.post[j], 1.f);
    }
    for (float v : c.comb) EXPECT_NEAR(v, 1.0 / hc, 2e-6) << "hc=" << hc;
  }
  // Saturation: a huge pre mix gives pre → 1 + eps, a huge negative post mix gives post → 0.
  {
    const int hc = 2;
    std::vector<float> mixes = {100.f, -100.f, -100.f, 100.f, 0, 0, 0, 0};
    std::vector<float> base(8, 0.f);
    const float scale[3] = {1.f, 1.f, 1.f};
    auto c = hc_split_sinkhorn(mixes.data(), scale, base.data(), hc, 20, 1e-6f);
    EXPECT_NEAR(c.pre[0], 1.0, 2e-6);
    EXPECT_NEAR(c.pre[1], 1e-6, 1e-9);  // σ(−100) ≈ 4e-44: only hc_eps remains
    EXPECT_NEAR(c.post[0], 0.0, 1e-12);
    EXPECT_NEAR(c.post[1], 2.0, 1e-6);
  }
  // hc = 2 with one dominant entry per row on the diagonal: Sinkhorn keeps it a near-permutation.
  {
    const int hc = 2;
    std::vector<float> mixes = {0, 0, 0, 0, 10.f, 0.f, 0.f, 10.f};
    std::vector<float> base(8, 0.f);
    const float scale[3] = {1.f, 1.f, 1.f};
    auto c = hc_split_sinkhorn(mixes.data(), scale, base.data(), hc, 20, 1e-6f);
    // softmax([10, 0]) = [1/(1+e^−10), e^−10/(1+e^−10)] = [0.9999546, 4.54e-5]; symmetric, so the
    // doubly-stochastic normalization leaves it (up to eps) as is.
    EXPECT_NEAR(c.comb[0], 0.9999546, 2e-6);
    EXPECT_NEAR(c.comb[1], 4.54e-5, 2e-6);
    EXPECT_NEAR(c.comb[2], 4.54e-5, 2e-6);
    EXPECT_NEAR(c.comb[3], 0.9999546, 2e-6);
  }
}

TEST(OpsRefHc, ExpandSumsOverFirstIndexOfComb) {
  // hc = 2, d = 1, X = [1, 10], comb[j*hc+k] = [[1, 2], [3, 4]] (not symmetric), post = [0.5, 2], y = [1].
  // X'_k = post_k·y + Σ_j comb[j,k]·X_j:  X'_0 = 0.5 + 1·1 + 3·10 = 31.5;  X'_1 = 2 + 2·1 + 4·10 = 44.
  // (Summing over the second index instead would give 0.5 + 21 = 21.5 and 2 + 43 = 45.)
  float x[] = {1.f, 10.f};
  const float y[] = {1.f};
  const float post[] = {0.5f, 2.f};
  const float comb[] = {1.f, 2.f, 3.f, 4.f};
  hc_expand(x, y, post, comb, 2, 1);
  EXPECT_EQ(x[0], 31.5f);
  EXPECT_EQ(x[1], 44.f);
}

TEST(OpsRefHc, ExpandAndCollapseMatchDoubleOnRandom) {
  const int hc = 4;
  const size_t d = 17;
  auto x = random_floats(hc * d, 41);
  auto y = random_floats(d, 42);
  auto post = random_floats(hc, 43, 0.f, 2.f);
  auto comb = random_floats(hc * hc, 44, 0.f, 1.f);
  auto pre = random_floats(hc, 45, 0.f, 1.f);
  std::vector<float> collapsed(d);
  hc_collapse(x.data(), pre.data(), hc, d, collapsed.data());
  for (size_t i = 0; i < d; ++i) {
    double ref = 0;
    for (int j = 0; j < hc; ++j) ref += double(pre[j]) * x[j * d + i];
    EXPECT_NEAR(collapsed[i], ref, 1e-6) << i;  // 4-term f32 sums of |terms| ≤ 1
  }
  auto out = x;
  hc_expand(out.data(), y.data(), post.data(), comb.data(), hc, d);
  for (int k = 0; k < hc; ++k)
    for (size_t i = 0; i < d; ++i) {
      double ref = double(post[k]) * y[i];
      for (int j = 0; j < hc; ++j) ref += double(comb[j * hc + k]) * x[j * d + i];
      EXPECT_NEAR(out[k * d + i], ref, 2e-6) << "k=" << k << " i=" << i;  // 5-term f32 sum, |terms| ≤ 2
    }
}

TEST(OpsRefHc, MixesMatchDouble) {
  const int hc = 4;
  const size_t d = 33, hc_d = hc * d, n_out = 24;
  auto x = random_floats(hc_d, 51, -2.f, 2.f);
  auto fn = random_floats(n_out * hc_d, 52);
  std::vector<float> mixes(n_out);
  hc_mixes(x.data(), fn.data(), n_out, hc_d, 1e-6f, mixes.data());
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / hc_d + 1e-6);
  for (size_t o = 0; o < n_out; ++o) {
    double dot = 0, abs_sum = 0;
    for (size_t i = 0; i < hc_d; ++i) dot += double(fn[o * hc_d + i]) * x[i], abs_sum += std::fabs(double(fn[o * hc_d + i]) * x[i]);
    // f32 dot product of 132 terms (γ_n bound) then a few roundings on the scale.
    EXPECT_NEAR(mixes[o], dot * inv, (hc_d + 4) * kF32Eps * abs_sum * inv) << o;
  }
}

// ---------------------------------------------------------------------------------------------
// Sparse attention with sink

// Direct double softmax with a sink (specs §3): o_h = Σ_j p_j c_j / (Σ_j p_j + exp(sink_h − m)).
// With round_p, p_j in the numerator is rounded to bf16 as the reference kernel does.
std::vector<double> attn_sink_double(const std::vector<float>& q, const std::vector<const float*>& rows,
                                     const std::vector<float>& sink, size_t n_heads, size_t d_head, double scale,
                                     bool round_p) {
  std::vector<double> out(n_heads * d_head, 0.0);
  for (size_t h = 0; h < n_heads; ++h) {
    if (rows.empty()) continue;
    std::vector<double> l(rows.size());
    double m = -INFINITY;
    for (size_t j = 0; j < rows.size(); ++j) {
      double dot = 0;
      for (size_t i = 0; i < d_head; ++i) dot += double(q[h * d_head + i]) * rows[j][i];
      l[j] = dot * scale;
      m = std::max(m, l[j]);
    }
    double denom = std::exp(double(sink[h]) - m);
    for (size_t j = 0; j < rows.size(); ++j) {
      const double p = std::exp(l[j] - m);
      denom += p;
      const double pv = round_p ? double(round_bf16(float(p))) : p;
      for (size_t i = 0; i < d_head; ++i) out[h * d_head + i] += pv * rows[j][i];
    }
    for (size_t i = 0; i < d_head; ++i) out[h * d_head + i] /= denom;
  }
  return out;
}

TEST(OpsRefAttention, MatchesDirectSoftmaxWithSink) {
  const size_t n_heads = 3, d_head = 64, pool = 40;
  auto kv = random_floats(pool * d_head, 61, -2.f, 2.f);
  auto q = random_floats(n_heads * d_head, 62, -1.f, 1.f);
  const std::vector<float> sink = {-1.f, 0.5f, 3.f};
  const float scale = 1.0f / std::sqrt(float(d_head));
  // Index lists as the model builds them (window entries, then selected compressed ones), already
  // free of −1; odd lengths 1, 7, 17, 40, with repeats and out-of-order entries.
  std::vector<std::vector<int>> lists = {{5}, {0, 3, 9, 12, 30, 31, 39}, {}, {}};
  for (int i = 0; i < 17; ++i) lists[2].push_back((i * 7) % int(pool));
  for (int i = int(pool) - 1; i >= 0; --i) lists[3].push_back(i);
  for (bool round_p : {false, true}) {
    for (const auto& list : lists) {
      SCOPED_TRACE(::testing::Message() << "n_rows=" << list.size() << " round_p=" << round_p);
      std::vector<const float*> rows;
      for (int idx : list) rows.push_back(kv.data() + idx * d_head);
      std::vector<float> out(n_heads * d_head, std::numeric_limits<float>::quiet_NaN());
      sparse_attn_sink(q.data(), rows.data(), rows.size(), sink.data(), n_heads, d_head, scale, round_p, out.data());
      auto ref = attn_sink_double(q, rows, sink, n_heads, d_head, scale, round_p);
      for (size_t i = 0; i < out.size(); ++i) {
        // Outputs are convex-ish combinations of |c| ≤ 2; f32 logits/exp/sums over ≤ 40 rows:
        // ~1e-6 relative error per term. With round_p, f32 p can round to a different bf16 than
        // the double p on a tie boundary (one bf16 ulp, 2^-8 relative, on one term): allow 2^-8·2.
        const double tol = round_p ? 2.0 / 256 : 1e-5;
        ASSERT_NEAR(out[i], ref[i], tol) << "i=" << i;
      }
    }
  }
}

TEST(OpsRefAttention, BfloatRoundingOfPChangesTheResultSlightly) {
  const size_t n_heads = 2, d_head = 32, n_rows = 9;
  auto kv = random_floats(n_rows * d_head, 71);
  auto q = random_floats(n_heads * d_head, 72, -3.f, 3.f);
  const std::vector<float> sink = {0.f, 0.f};
  std::vector<const float*> rows;
  for (size_t j = 0; j < n_rows; ++j) rows.push_back(kv.data() + j * d_head);
  std::vector<float> exact(n_heads * d_head), rounded(n_heads * d_head);
  sparse_attn_sink(q.data(), rows.data(), n_rows, sink.data(), n_heads, d_head, 0.2f, false, exact.data());
  sparse_attn_sink(q.data(), rows.data(), n_rows, sink.data(), n_heads, d_head, 0.2f, true, rounded.data());
  double max_diff = 0;
  for (size_t i = 0; i < exact.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(exact[i] - rounded[i])));
  EXPECT_GT(max_diff, 0.0) << "round_p_bf16 had no effect";
  EXPECT_LT(max_diff, 1.0 / 128) << "bf16 rounding of p (2^-9 relative) moved the output too far";
}

TEST(OpsRefAttention, EmptyRowListGivesZero) {
  const size_t n_heads = 2, d_head = 8;
  std::vector<float> q(n_heads * d_head, 1.f), sink = {5.f, -5.f};
  std::vector<float> out(n_heads * d_head, std::numeric_limits<float>::quiet_NaN());
  sparse_attn_sink(q.data(), nullptr, 0, sink.data(), n_heads, d_head, 1.f, false, out.data());
  for (float v : out) EXPECT_EQ(v, 0.f);
}

TEST(OpsRefAttention, SinkOnlyEnlargesTheDenominator) {
  // One row c, logit ℓ: o = c·1/(1 + exp(sink − ℓ)). Here q·c = 0 ⇒ m = ℓ = 0, so
  // sink = 0 → o = c/2; sink = ln 3 → o = c/4; sink = −1e30 → o = c (plain softmax of one row).
  const size_t d_head = 4;
  const float c[] = {1.f, -2.f, 4.f, 8.f};
  const float q[] = {0.f, 0.f, 0.f, 0.f};
  const float* rows[] = {c};
  for (auto [sink, factor] : {std::pair{0.f, 0.5f}, {std::log(3.f), 0.25f}, {-1e30f, 1.f}}) {
    float out[4];
    sparse_attn_sink(q, rows, 1, &sink, 1, d_head, 1.f, false, out);
    for (size_t i = 0; i < d_head; ++i) EXPECT_NEAR(out[i], c[i] * factor, 1e-6 * std::fabs(c[i])) << "sink=" << sink;
  }
  // Several rows: with sink s the output is the sink-free output × Σp/(Σp + e^{s−m}).
  const size_t n_rows = 5, d = 16;
  auto kv = random_floats(n_rows * d, 81);
  auto qq = random_floats(d, 82, -2.f, 2.f);
  std::vector<const float*> rs;
  for (size_t j = 0; j < n_rows; ++j) rs.push_back(kv.data() + j * d);
  const float no_sink = -1e30f, with_sink = 1.5f;
  std::vector<float> a(d), b(d);
  sparse_attn_sink(qq.data(), rs.data(), n_rows, &no_sink, 1, d, 0.5f, false, a.data());
  sparse_attn_sink(qq.data(), rs.data(), n_rows, &with_sink, 1, d, 0.5f, false, b.data());
  double m = -INFINITY, sum_p = 0;
  std::vector<double> l(n_rows);
  for (size_t j = 0; j < n_rows; ++j) {
    double dot = 0;
    for (size_t i = 0; i < d; ++i) dot += double(qq[i]) * rs[j][i];
    l[j] = dot * 0.5;
    m = std::max(m, l[j]);
  }
  for (double v : l) sum_p += std::exp(v - m);
  const double shrink = sum_p / (sum_p + std::exp(with_sink - m));
  for (size_t i = 0; i < d; ++i) EXPECT_NEAR(b[i], a[i] * shrink, 1e-6) << i;
}

// ---------------------------------------------------------------------------------------------
// Hadamard

TEST(OpsRefHadamard, MatchesSylvesterMatrix) {
  for (size_t n : {1, 2, 4, 8, 128}) {
    const size_t n_rows = 3;
    auto x = random_floats(n_rows * n, 91 + unsigned(n));
    auto y = x;
    hadamard_rows(y.data(), n_rows, n);
    for (size_t r = 0; r < n_rows; ++r)
      for (size_t i = 0; i < n; ++i) {
        double ref = 0;
        // Sylvester natural order: H[i][j] = (−1)^popcount(i & j) / sqrt(n).
        for (size_t j = 0; j < n; ++j) ref += (std::popcount(i & j) % 2 ? -1.0 : 1.0) * x[r * n + j];
        ref /= std::sqrt(double(n));
        // log2(n) butterfly stages of f32 adds on |x| ≤ 1, then one scale: ≤ (log2 n + 1)·u·Σ|x|/√n.
        EXPECT_NEAR(y[r * n + i], ref, 1e-6 * std::sqrt(double(n))) << "n=" << n << " r=" << r << " i=" << i;
      }
  }
}

TEST(OpsRefHadamard, OrthonormalTwiceIsIdentityAndNormPreserved) {
  const size_t n = 128, n_rows = 5;
  auto x = random_floats(n_rows * n, 95, -4.f, 4.f);
  auto y = x;
  hadamard_rows(y.data(), n_rows, n);
  for (size_t r = 0; r < n_rows; ++r) {
    double n0 = 0, n1 = 0;
    for (size_t i = 0; i < n; ++i) n0 += double(x[r * n + i]) * x[r * n + i], n1 += double(y[r * n + i]) * y[r * n + i];
    EXPECT_NEAR(n1, n0, 1e-5 * n0) << "row " << r;
  }
  hadamard_rows(y.data(), n_rows, n);  // H·H = I for the orthonormal (scaled) Hadamard
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-5) << i;  // |x| ≤ 4, 16 f32 stages
}

// ---------------------------------------------------------------------------------------------
// top-k

TEST(OpsRefTopk, TiesGoToLowerIndex) {
  const float v[] = {1.f, 3.f, 2.f, 3.f, 3.f, 0.f, 2.f};
  EXPECT_EQ(topk_indices(v, 7, 1), (std::vector<int32_t>{1}));
  EXPECT_EQ(topk_indices(v, 7, 2), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(topk_indices(v, 7, 4), (std::vector<int32_t>{1, 3, 4, 2}));
  EXPECT_EQ(topk_indices(v, 7, 5), (std::vector<int32_t>{1, 3, 4, 2, 6}));
  const float all_equal[] = {5.f, 5.f, 5.f, 5.f};
  EXPECT_EQ(topk_indices(all_equal, 4, 3), (std::vector<int32_t>{0, 1, 2}));
  // −∞ entries (invisible) rank last, still lower index first among themselves.
  const float masked[] = {-INFINITY, 1.f, -INFINITY, 0.f};
  EXPECT_EQ(topk_indices(masked, 4, 4), (std::vector<int32_t>{1, 3, 0, 2}));
}

TEST(OpsRefTopk, KLargerThanNAndZero) {
  const float v[] = {0.5f, -1.f, 2.f};
  EXPECT_EQ(topk_indices(v, 3, 10), (std::vector<int32_t>{2, 0, 1}));
  EXPECT_TRUE(topk_indices(v, 3, 0).empty());
  EXPECT_TRUE(topk_indices(v, 0, 4).empty());
}

TEST(OpsRefTopk, MatchesStableSortOnRandomWithTies) {
  std::mt19937 gen(123);
  std::uniform_int_distribution<int> dist(0, 20);  // many ties
  for (size_t n : {1, 7, 17, 127, 1023}) {
    std::vector<float> v(n);
    for (float& x : v) x = float(dist(gen)) * 0.25f;
    std::vector<int32_t> ref(n);
    for (size_t i = 0; i < n; ++i) ref[i] = int32_t(i);
    std::stable_sort(ref.begin(), ref.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
    for (size_t k : {size_t(1), size_t(5), n / 2, n}) {
      auto got = topk_indices(v.data(), n, k);
      ASSERT_EQ(got, std::vector<int32_t>(ref.begin(), ref.begin() + std::min(k, n))) << "n=" << n << " k=" << k;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// MoE building blocks

TEST(OpsRefMoe, SqrtSoftplusMatchesDouble) {
  const std::vector<float> logits = {-100.f, -20.f, -1.f, 0.f, 0.5f, 1.f, 19.9f, 20.1f, 30.f, 88.f};
  std::vector<float> s(logits.size());
  sqrtsoftplus(logits.data(), s.data(), logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const double ref = std::sqrt(std::log1p(std::exp(double(logits[i]))));
    // f32 exp/log1p/sqrt: a few ulps relative; the x > 20 shortcut (softplus(x) = x) errs by
    // log1p(e^−x) ≈ 2e-9 relative, far below that. For x = −100, e^x = 3.7e-44 is an f32
    // subnormal with ~4 significant bits: only ~1% relative accuracy is possible (as in torch f32).
    const double rel = logits[i] < -87.f ? 2e-2 : 4 * kF32Eps;
    EXPECT_NEAR(s[i], ref, rel * ref) << "x=" << logits[i];
    EXPECT_GT(s[i], 0.f) << "scores must stay positive, x=" << logits[i];
  }
  // softplus(0) = ln 2 → sqrt = 0.8325546.
  EXPECT_NEAR(s[3], 0.83255461, 1e-7);
}

TEST(OpsRefMoe, RouteWeightsNormalizeAndScale) {
  const float scores[] = {0.1f, 0.4f, 0.2f, 0.3f, 0.9f};
  const int32_t idx[] = {1, 3, 4};
  float w[3];
  // Σ = 0.4 + 0.3 + 0.9 = 1.6 → w = [0.25, 0.1875, 0.5625] · 1.5 = [0.375, 0.28125, 0.84375].
  route_weights(scores, idx, 3, 0.f, 1.5f, w);
  EXPECT_NEAR(w[0], 0.375f, 1e-7);
  EXPECT_NEAR(w[1], 0.28125f, 1e-7);
  EXPECT_NEAR(w[2], 0.84375f, 1e-7);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.5f, 1e-6);
  // V4.1 adds 1e-20 to the sum: invisible at these magnitudes, but keeps all-zero scores finite.
  route_weights(scores, idx, 3, 1e-20f, 1.5f, w);
  EXPECT_NEAR(w[2], 0.84375f, 1e-7);
  const float zeros[] = {0.f, 0.f};
  const int32_t idx2[] = {0, 1};
  float w2[2];
  route_weights(zeros, idx2, 2, 1e-20f, 1.5f, w2);
  EXPECT_EQ(w2[0], 0.f);
  EXPECT_EQ(w2[1], 0.f);
}

double silu_d(double x) { return x / (1 + std::exp(-x)); }

TEST(OpsRefMoe, SwigluClampGateAboveOnlyUpBothSides) {
  const float limit = 10.f;
  const std::vector<float> g = {15.f, -15.f, 3.f, 10.f, -30.f};
  const std::vector<float> u = {2.f, 2.f, 15.f, -15.f, 5.f};
  std::vector<float> h(g.size());
  swiglu(g.data(), u.data(), h.data(), g.size(), limit, 0.5f);
  // gate: min(g, 10) — 15 → 10, but −15 and −30 stay (no lower clamp); up: clamp(u, ±10).
  const double expected[] = {silu_d(10) * 2 * 0.5, silu_d(-15) * 2 * 0.5, silu_d(3) * 10 * 0.5,
                             silu_d(10) * -10 * 0.5, silu_d(-30) * 5 * 0.5};
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(h[i], expected[i], 4 * kF32Eps * std::fabs(expected[i]) + 1e-30) << "i=" << i;
  // A lower clamp on the gate at −10 would give silu(−10)·2·0.5 ≈ −4.5e-4 instead of ≈ −4.6e-6.
  EXPECT_LT(std::fabs(h[1]), 1e-5f);
}

TEST(OpsRefMoe, SwigluNonPositiveLimitDisablesClamp) {
  const std::vector<float> g = {15.f, 12.f};
  const std::vector<float> u = {20.f, -30.f};
  for (float limit : {0.f, -1.f}) {
    std::vector<float> h(2);
    swiglu(g.data(), u.data(), h.data(), 2, limit, 1.f);
    EXPECT_NEAR(h[0], silu_d(15) * 20, 1e-5 * silu_d(15) * 20) << "limit=" << limit;
    EXPECT_NEAR(h[1], silu_d(12) * -30, 1e-5 * silu_d(12) * 30) << "limit=" << limit;
  }
}

TEST(OpsRefMoe, ActivationHelpers) {
  EXPECT_FLOAT_EQ(sigmoid(0.f), 0.5f);
  EXPECT_FLOAT_EQ(silu(0.f), 0.f);
  EXPECT_NEAR(silu(1.f), 0.7310586, 1e-7);
  EXPECT_NEAR(softplus(0.f), std::log(2.0), 1e-7);
  EXPECT_FLOAT_EQ(softplus(50.f), 50.f);
  EXPECT_GT(softplus(-50.f), 0.f);
}

}  // namespace
}  // namespace spw::ref
