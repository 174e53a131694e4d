// The EXL3 quantizer on single tensors (src/quantize/exl3_quantize.h): what it writes decodes
// bit-exactly through the reader, LDLQ beats plain per-tile search on a correlated Hessian, the
// proxy error falls with K, the refit does not hurt, the candidate search keeps the best
// candidate, the block LDL factors H, and the polish pass lowers LDLQ's objective.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "formats/exl3.h"
#include "formats/safetensors.h"
#include "quantize/exl3_polish.h"
#include "quantize/exl3_quantize.h"
#include "quantize/safetensors_writer.h"

namespace spw::quant {
namespace {

// W [k][n] with uneven row/column scales; H = XᵀX/m for inputs with strongly correlated features.
struct Problem {
  int64_t k, n;
  std::vector<float> w;
  std::vector<double> h;
};

Problem make_problem(int64_t k, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0, 1);
  Problem p{k, n, std::vector<float>(size_t(k * n)), std::vector<double>(size_t(k * k), 0.0)};
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) p.w[size_t(i * n + j)] = float(0.02 * nd(rng) * (1 + 0.5 * std::sin(double(i))) * (1 + 0.3 * std::cos(double(j))));
  // x = A·z with a low-rank-plus-noise mixing: correlated inputs with a few dominant directions.
  const int r = 8, m = 512;
  std::vector<double> a(size_t(k * r));
  for (auto& v : a) v = nd(rng);
  std::vector<double> x(static_cast<size_t>(k));
  for (int t = 0; t < m; ++t) {
    double z[8];
    for (double& v : z) v = nd(rng);
    for (int64_t i = 0; i < k; ++i) {
      double s = 0.3 * nd(rng);
      for (int q = 0; q < r; ++q) s += a[size_t(i * r + q)] * z[q];
      x[size_t(i)] = s;
    }
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) p.h[size_t(i * k + j)] += x[size_t(i)] * x[size_t(j)] / m;
  }
  return p;
}

TEST(Exl3Quantize, WrittenTensorDecodesBitExactlyThroughTheReader) {
  const Problem p = make_problem(128, 128, 1);
  for (auto cb : {Exl3Codebook::kMul1, Exl3Codebook::kMcg, Exl3Codebook::k3Inst}) {
    QuantizeParams qp;
    qp.bits = 3;
    qp.codebook = cb;
    qp.seed = 5;
    qp.alternatives.clear();  // one candidate: the search has its own test
    auto q = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
    ASSERT_TRUE(q.ok()) << q.error().message;
    const std::string path = testing::TempDir() + "/exl3_q_roundtrip.safetensors";
    SafetensorsWriter wr;
    wr.add_raw("x.trellis", DType::I16, {q->k / 16, q->n / 16, 16 * q->bits}, q->trellis.data(), q->trellis.size() * 2);
    wr.add_raw("x.suh", DType::F16, {q->k}, q->suh.data(), q->suh.size() * 2);
    wr.add_raw("x.svh", DType::F16, {q->n}, q->svh.data(), q->svh.size() * 2);
    if (cb != Exl3Codebook::k3Inst) {
      const uint32_t m = cb == Exl3Codebook::kMul1 ? kExl3Mul1Mult : kExl3McgMult;
      wr.add_raw(cb == Exl3Codebook::kMul1 ? "x.mul1" : "x.mcg", DType::I32, {}, &m, 4);
    }
    ASSERT_TRUE(wr.write(path).ok());
    auto f = SafetensorsFile::open(path);
    ASSERT_TRUE(f.ok()) << f.error().message;
    auto t = exl3_load(**f, "x");
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->codebook, cb);
    EXPECT_EQ(t->bits.k_x2, 6);
    const std::vector<uint16_t> inner = exl3_decode_inner(*t);
    ASSERT_EQ(inner.size(), q->inner.size());
    for (size_t i = 0; i < inner.size(); ++i) ASSERT_EQ(exl3_f16_to_f32(inner[i]), q->inner[i]) << i;
    // The proxy error the quantizer reports is the one of the decoded tensor.
    const std::vector<float> wq = exl3_weight_ref(*t);
    EXPECT_NEAR(exl3_proxy_error(p.w.data(), wq.data(), p.k, p.n, p.h), q->proxy_err, 1e-12);
    EXPECT_LT(q->proxy_err, 0.1) << exl3_codebook_name(cb);
  }
}

TEST(Exl3Quantize, LdlqBeatsPlainSearchOnCorrelatedHessian) {
  const Problem p = make_problem(128, 128, 2);
  QuantizeParams qp;
  qp.bits = 2;
  qp.refit = false;
  qp.alternatives.clear();  // one candidate: the search has its own test
  auto with = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
  qp.ldlq = false;
  auto without = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
  ASSERT_TRUE(with.ok() && without.ok());
  std::printf("proxy error K=2: LDLQ %.5f, plain %.5f\n", with->proxy_err, without->proxy_err);
  EXPECT_LT(with->proxy_err, 0.8 * without->proxy_err);
}

TEST(Exl3Quantize, ProxyErrorFallsWithBitsAndRefitHelps) {
  const Problem p = make_problem(128, 128, 3);
  double prev = 1e9;
  for (int bits : {2, 3, 4}) {
    QuantizeParams qp;
    qp.bits = bits;
    qp.alternatives.clear();  // one candidate: the search has its own test
    auto q = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
    ASSERT_TRUE(q.ok());
    std::printf("K=%d proxy error %.5f (before refit %.5f)\n", bits, q->proxy_err, q->proxy_err_before_refit);
    EXPECT_LT(q->proxy_err, 0.6 * prev);
    EXPECT_LE(q->proxy_err, q->proxy_err_before_refit);
    prev = q->proxy_err;
  }
}

TEST(Exl3Quantize, DeterministicAndIdentityFallback) {
  const Problem p = make_problem(128, 128, 4);
  QuantizeParams qp;
  qp.bits = 2;
  auto a = exl3_quantize_tensor(p.w.data(), p.k, p.n, {}, qp);
  auto b = exl3_quantize_tensor(p.w.data(), p.k, p.n, std::vector<double>(size_t(128 * 128), 0.0), qp);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(b->fell_back_to_identity);
  EXPECT_EQ(a->trellis, b->trellis);
  EXPECT_EQ(a->suh, b->suh);
  EXPECT_EQ(a->svh, b->svh);
  EXPECT_FALSE(exl3_quantize_tensor(p.w.data(), 100, 128, {}, qp).ok());
  qp.bits = 9;
  EXPECT_FALSE(exl3_quantize_tensor(p.w.data(), p.k, p.n, {}, qp).ok());
}

// The default quantizes once per candidate (regularisation strength, signs, global-scale multiplier)
// without the polish, keeps the lowest proxy error on the undamped H, then quantizes that winner
// again with the polish and keeps whichever is lower (quantize_search): exactly the result of that
// run alone.
TEST(Exl3Quantize, CandidateSearchKeepsTheLowestProxyError) {
  const Problem p = make_problem(128, 128, 7);
  QuantizeParams qp;
  qp.bits = 2;
  qp.seed = 3;
  ASSERT_GT(qp.polish_passes, 0);
  auto best = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
  ASSERT_TRUE(best.ok()) << best.error().message;
  const std::vector<QuantizeCandidate> cands = quantize_candidates(qp, true);
  ASSERT_EQ(cands.size(), 1 + qp.alternatives.size());
  EXPECT_EQ(best->candidates, int(cands.size()));
  double lowest = INFINITY;
  int lowest_i = -1;
  for (size_t i = 0; i < cands.size(); ++i) {
    QuantizeParams cp = candidate_params(qp, cands[i]);
    cp.polish_passes = 0;
    auto r = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, cp);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->candidates, 1);
    EXPECT_EQ(r->polish_passes, 0);
    EXPECT_EQ(r->sigma_reg, cands[i].sigma_reg);
    EXPECT_EQ(r->seed, qp.seed + cands[i].seed_offset);
    EXPECT_EQ(r->scale_mult, cands[i].scale_mult);
    if (r->proxy_err < lowest) {
      lowest = r->proxy_err;
      lowest_i = int(i);
    }
  }
  auto polished = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, candidate_params(qp, cands[size_t(lowest_i)]));
  ASSERT_TRUE(polished.ok()) << polished.error().message;
  EXPECT_EQ(polished->polish_passes, qp.polish_passes);
  std::printf("best unpolished candidate #%d %.6f, polished %.6f\n", lowest_i, lowest, polished->proxy_err);
  EXPECT_EQ(best->candidate, lowest_i);
  EXPECT_EQ(best->proxy_err, std::min(lowest, polished->proxy_err));
  if (polished->proxy_err < lowest) {
    EXPECT_EQ(best->trellis, polished->trellis);
    EXPECT_EQ(best->suh, polished->suh);
    EXPECT_EQ(best->svh, polished->svh);
    EXPECT_EQ(best->polish_passes, qp.polish_passes);
  }
  EXPECT_EQ(best->sigma_reg, cands[size_t(lowest_i)].sigma_reg);
  EXPECT_EQ(best->scale_mult, cands[size_t(lowest_i)].scale_mult);
  // The identity Hessian: one candidate (the uncalibrated baseline), sigma_reg reported as 0, no
  // polish (it needs LDLQ's Hessian).
  auto id = exl3_quantize_tensor(p.w.data(), p.k, p.n, {}, qp);
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(id->candidates, 1);
  EXPECT_EQ(id->sigma_reg, 0.0);
  EXPECT_EQ(id->seed, qp.seed);
  EXPECT_EQ(id->polish_passes, 0);
}

// scale_mult multiplies the global scale the tile search finds, nothing else: the search result
// itself does not depend on it.
TEST(Exl3Quantize, ScaleMultScalesTheGlobalScale) {
  const Problem p = make_problem(128, 128, 9);
  QuantizeParams qp;
  qp.bits = 2;
  qp.seed = 5;
  qp.alternatives.clear();
  auto base = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
  ASSERT_TRUE(base.ok()) << base.error().message;
  EXPECT_EQ(base->scale_mult, 1.0);
  qp.scale_mult = 0.97;
  auto scaled = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
  ASSERT_TRUE(scaled.ok()) << scaled.error().message;
  EXPECT_EQ(scaled->global_scale, base->global_scale * 0.97);
  EXPECT_EQ(scaled->scale_mult, 0.97);
  EXPECT_NE(scaled->trellis, base->trellis);
  // Both are valid quantizations of the same tensor: the errors are of one size (K=2: ~3-7 %).
  EXPECT_LT(std::abs(scaled->proxy_err / base->proxy_err - 1), 0.2);
}

TEST(Exl3Quantize, BlockLdlFactorsTheHessian) {
  Problem p = make_problem(64, 16, 5);
  for (int64_t i = 0; i < 64; ++i) p.h[size_t(i * 64 + i)] += 0.1;
  auto l = block_ldl(p.h, 64);
  ASSERT_TRUE(l.ok());
  // L is unit block-lower-triangular and L⁻¹·H·L⁻ᵀ (= D) is block diagonal.
  const int64_t k = 64;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const double v = (*l)[size_t(i * k + j)];
      if (j / 16 > i / 16) { EXPECT_EQ(v, 0.0); }
      if (j / 16 == i / 16) { EXPECT_NEAR(v, i == j ? 1.0 : 0.0, 1e-12); }
    }
  auto solve_lower = [&](std::vector<double> b) {  // L·X = B, column by column
    for (int64_t c = 0; c < k; ++c)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t q = 0; q < i; ++q) b[size_t(i * k + c)] -= (*l)[size_t(i * k + q)] * b[size_t(q * k + c)];
    return b;
  };
  std::vector<double> y = solve_lower(p.h), yt(y.size());
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) yt[size_t(j * k + i)] = y[size_t(i * k + j)];
  const std::vector<double> d = solve_lower(yt);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j)
      if (i / 16 != j / 16) { EXPECT_NEAR(d[size_t(i * k + j)], 0.0, 1e-9) << i << "," << j; }
}

// tr(Δᵀ·H·Δ) for Δ [k][n]: the objective LDLQ and the polish pass work on.
double ldlq_objective(const std::vector<double>& h, const std::vector<double>& delta, int64_t k, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < n; ++j) s += delta[size_t(i * n + j)] * h[size_t(i * k + l)] * delta[size_t(l * n + j)];
  return s;
}

// polish_pass on a plain per-tile quantization (no feedback) of unit-variance targets under a
// correlated H: every pass lowers tr(ΔᵀHΔ) or leaves it (a tile is kept only if it lowers it), the
// first one clearly (it adds the feedback the plain search lacks), and the words it rewrites decode
// to the Q it reports.
TEST(Exl3Quantize, PolishPassLowersTheLdlqObjective) {
  const int64_t k = 128, n = 64;
  Problem p = make_problem(k, n, 11);
  double mean_diag = 0;
  for (int64_t i = 0; i < k; ++i) mean_diag += p.h[size_t(i * k + i)] / double(k);
  for (int64_t i = 0; i < k; ++i) p.h[size_t(i * k + i)] += 0.025 * mean_diag;  // the quantizer's damping
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(0, 1);
  std::vector<double> t(size_t(k * n)), q(size_t(k * n)), delta(size_t(k * n));
  for (auto& v : t) v = nd(rng);
  for (int bits : {2, 3}) {
    TrellisEncoder enc(bits, Exl3Codebook::kMul1);
    const int64_t n_tn = n / 16, words_per_tile = 16 * bits;
    std::vector<uint16_t> words(size_t(k / 16 * n_tn * words_per_tile));
    float tile[256], dec[256];
    for (int64_t tk = 0; tk < k / 16; ++tk)
      for (int64_t tn = 0; tn < n_tn; ++tn) {
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 16; ++c) tile[r * 16 + c] = float(t[size_t((tk * 16 + r) * n + tn * 16 + c)]);
        enc.encode_tile_rowmajor(tile, &words[size_t((tk * n_tn + tn) * words_per_tile)], dec);
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 16; ++c) {
            const size_t at = size_t((tk * 16 + r) * n + tn * 16 + c);
            q[at] = dec[r * 16 + c];
            delta[at] = t[at] - q[at];
          }
      }
    const double f0 = ldlq_objective(p.h, delta, k, n);
    const int64_t changed1 = polish_pass(p.h, t, q, delta, words, enc, k, n);
    const double f1 = ldlq_objective(p.h, delta, k, n);
    const int64_t changed2 = polish_pass(p.h, t, q, delta, words, enc, k, n);
    const double f2 = ldlq_objective(p.h, delta, k, n);
    std::printf("K=%d tr(dHd): plain %.4f, 1 pass %.4f (%lld tiles), 2 passes %.4f (%lld tiles)\n", bits, f0, f1,
                (long long)changed1, f2, (long long)changed2);
    EXPECT_GT(changed1, 0);
    // Strongly correlated H: feedback matters (LDLQ vs plain is 0.8× or better at K=2, test above).
    EXPECT_LT(f1, 0.9 * f0);
    EXPECT_LE(f2, f1 * (1 + 1e-12));  // the per-tile test is exact up to fp64 rounding of the sums
    for (size_t i = 0; i < delta.size(); ++i) ASSERT_EQ(delta[i], t[i] - q[i]) << i;
    // The rewritten words decode to q.
    QuantizedTensor qt;
    qt.k = k;
    qt.n = n;
    qt.bits = bits;
    qt.trellis = words;
    qt.suh.assign(size_t(k), exl3_f64_to_f16(1.0));
    qt.svh.assign(size_t(n), exl3_f64_to_f16(1.0));
    const std::vector<uint16_t> inner = exl3_decode_inner(qt.view("polish"));
    ASSERT_EQ(inner.size(), q.size());
    for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(double(exl3_f16_to_f32(inner[i])), q[i]) << i;
  }
}

// The quantizer with its default polish pass against none, one candidate each, over a few sign
// seeds: lower proxy error on average. On the 48 demo-model tuning tensors one pass lowered every
// candidate's error (bench/results/quantize_wide_2026-12-03.md); here the bound only asks for a
// lower mean over 4 seeds, as the noise between sign draws (~1-2 %) is larger than a per-seed margin.
TEST(Exl3Quantize, PolishLowersTheProxyErrorOnAverage) {
  const Problem p = make_problem(128, 128, 13);
  double with_sum = 0, without_sum = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    QuantizeParams qp;
    qp.bits = 2;
    qp.seed = seed;
    qp.alternatives.clear();
    ASSERT_GT(qp.polish_passes, 0) << "the default polishes";
    auto with = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
    qp.polish_passes = 0;
    auto without = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
    ASSERT_TRUE(with.ok() && without.ok());
    std::printf("seed %llu: proxy error polished %.6f, not %.6f\n", (unsigned long long)seed, with->proxy_err,
                without->proxy_err);
    with_sum += with->proxy_err;
    without_sum += without->proxy_err;
  }
  EXPECT_LT(with_sum, without_sum);
}

}  // namespace
}  // namespace spw::quant
