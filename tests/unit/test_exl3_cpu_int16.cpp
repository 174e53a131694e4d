// Exl3Activations::kInt16 (cpu/exl3_gemm_int16.cpp): the approximate MUL1 kernel with 15-bit activations,
// against the fp64 reference exl3_matmul_ref, at the V4.1 expert shapes and awkward ones, m = 1..8 (from
// kAmxMinTokens = 10 tokens the option runs the exact kernel: checked bit for bit), K 1–4 and half-integer,
// forced k-splits (parts starting inside a 128-row scale block), bias on and off; and exl3_moe_cpu with it
// against the exact MoE. Tolerance (written down, with its reason): relative error ‖y − ref‖ / ‖ref‖ ≤ 5e-4
// and every element within 2.5e-3·RMS(ref). The sources are the skipped fp16 rounding of Ŵ (up to 2^-12 of
// each weight) and x's 15-bit quantization per 128-row block (≤ 2^-16 of the block's max per element);
// measured 1.9e-4 to 2.2e-4 relative and at most 1.3e-3·RMS per element on these cases (printed), so the
// bounds leave ~2× room while a common-mode error (the affine term taken over x instead of the quantized x
// put 5e-3·RMS on each Hadamard block's first column) fails them. An outlier case checks that a 1000σ
// activation stays within the same bounds (the per-block scale confines it). The MoE (two products in
// sequence through SwiGLU, measured 3.6e-4) is allowed twice the relative bound.
// The kernel must really run: its output differs from the exact kernel's, and other codebooks (which it does
// not take) give the exact kernel's bits.
#if defined(SPW_HAVE_CPU)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/exl3_gemm.h"
#include "base/thread_pool.h"
#include "cpu/exl3_moe.h"
#include "exl3_random.h"

namespace spw {
namespace {

struct Errors {
  double rel = 0, max_over_rms = 0;
};

Errors errors(const std::vector<float>& y, const std::vector<float>& ref) {
  double num = 0, den = 0, max_abs = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = double(y[i]) - ref[i];
    num += e * e;
    den += double(ref[i]) * ref[i];
    max_abs = std::max(max_abs, std::fabs(e));
  }
  const double rms = std::sqrt(den / ref.size());
  return {std::sqrt(num / den), max_abs / rms};
}

Exl3CpuOptions int16_options(int k_splits = 0) {
  Exl3CpuOptions o;
  o.activations = Exl3Activations::kInt16;
  o.k_splits = k_splits;
  return o;
}

void check_int16(const Exl3Tensor& t, int64_t m, uint32_t seed, int k_splits, float outlier = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(static_cast<size_t>(m * t.k));
  for (auto& v : x) v = nd(rng);
  if (outlier != 0) x[static_cast<size_t>(t.k / 3)] = outlier;
  std::vector<float> ref(static_cast<size_t>(m * t.n));
  exl3_matmul_ref(t, x.data(), m, ref.data());

  const int64_t guard = 64;
  const float sentinel = 12345.678f;
  std::vector<float> y(static_cast<size_t>(m * t.n + 2 * guard), sentinel), exact(static_cast<size_t>(m * t.n));
  exl3_matmul_cpu_opts(int16_options(k_splits), t, x.data(), m, y.data() + guard);
  Exl3CpuOptions fp32;
  fp32.k_splits = k_splits;
  exl3_matmul_cpu_opts(fp32, t, x.data(), m, exact.data());
  for (int64_t i = 0; i < guard; ++i) {
    ASSERT_EQ(y[i], sentinel);
    ASSERT_EQ(y[guard + m * t.n + i], sentinel);
  }
  std::vector<float> out(y.begin() + guard, y.end() - guard);
  size_t differ = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << i;
    differ += out[i] != exact[i];
  }
  const Errors e = errors(out, ref);
  std::printf("  int16 k=%lld n=%lld K2=%d m=%lld k_splits=%d%s: rel %.2e, max %.2e·RMS (exact kernel: rel %.2e)\n",
              static_cast<long long>(t.k), static_cast<long long>(t.n), t.bits.k_x2, static_cast<long long>(m),
              k_splits, outlier != 0 ? " outlier" : "", e.rel, e.max_over_rms, errors(exact, ref).rel);
  EXPECT_GT(differ, out.size() / 2) << "the int16 kernel did not run (output equals the exact kernel's)";
  EXPECT_LT(e.rel, 5e-4);
  EXPECT_LT(e.max_over_rms, 2.5e-3);
}

class Exl3CpuInt16 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!detail::exl3_int16_ready()) GTEST_SKIP() << "no AVX-512 VBMI + VNNI on this machine: the option runs the exact kernel";
  }
};

TEST_F(Exl3CpuInt16, RealShapes) {
  std::mt19937 rng(11);
  uint32_t seed = 1;
  struct Case { int64_t k, n, m; int k_x2; bool bias; };
  for (const Case& c : {Case{5120, 2304, 1, 6, false}, Case{2304, 5120, 2, 6, true}, Case{4096, 2048, 3, 6, false},
                        Case{5120, 2304, 8, 6, false}}) {
    test::OwnedExl3 o;
    test::fill_random_exl3(o, c.k, c.n, c.k_x2, Exl3Codebook::kMul1, rng, 0.03f, c.bias);
    check_int16(o.t, c.m, seed++, 0);
  }
}

TEST_F(Exl3CpuInt16, BitWidthsSizesAndSplits) {
  std::mt19937 rng(12);
  uint32_t seed = 100;
  struct Case { int64_t k, n, m; int k_x2, k_splits; };
  // Half-integer K (3, 5), a tile under 64 bytes (K 1.5), 3 and 5 k-splits of 9 and 40 k-tiles (parts that
  // start and end inside a scale block), many tokens (the run-time-m loop).
  for (const Case& c : {Case{128, 128, 1, 3, 0}, Case{384, 640, 7, 5, 3}, Case{1152, 128, 5, 8, 0},
                        Case{128, 1920, 9, 4, 0}, Case{640, 256, 2, 6, 5}, Case{256, 384, 4, 2, 0}}) {
    test::OwnedExl3 o;
    test::fill_random_exl3(o, c.k, c.n, c.k_x2, Exl3Codebook::kMul1, rng, 0.03f, (seed & 1) != 0);
    check_int16(o.t, c.m, seed++, c.k_splits);
  }
}

TEST_F(Exl3CpuInt16, OutlierStaysInItsBlock) {
  std::mt19937 rng(13);
  test::OwnedExl3 o;
  test::fill_random_exl3(o, 2048, 512, 6, Exl3Codebook::kMul1, rng, 0.03f, false);
  check_int16(o.t, 1, 7, 0, 1000.0f);
}

// The option covers MUL1 below kAmxMinTokens tokens only: other codebooks, and MUL1 from 10 tokens, run the
// exact kernel, bit for bit.
TEST_F(Exl3CpuInt16, OtherCodebooksAndManyTokensAreExact) {
  std::mt19937 rng(14);
  for (auto [cb, m] : {std::pair{Exl3Codebook::kMcg, 2}, std::pair{Exl3Codebook::k3Inst, 2},
                       std::pair{Exl3Codebook::kMul1, int(detail::kAmxMinTokens)}}) {
    test::OwnedExl3 o;
    test::fill_random_exl3(o, 512, 256, 6, cb, rng, 0.03f, true);
    std::vector<float> x(m * 512);
    for (auto& v : x) v = std::normal_distribution<float>(0, 1)(rng);
    std::vector<float> a(m * 256), b(m * 256);
    exl3_matmul_cpu_opts(int16_options(), o.t, x.data(), m, a.data());
    exl3_matmul_cpu_opts(Exl3CpuOptions{}, o.t, x.data(), m, b.data());
    EXPECT_EQ(a, b) << exl3_codebook_name(cb) << " m=" << m;
  }
}

TEST_F(Exl3CpuInt16, ZeroInputGivesTheBias) {
  std::mt19937 rng(15);
  test::OwnedExl3 o;
  test::fill_random_exl3(o, 256, 128, 6, Exl3Codebook::kMul1, rng, 0.03f, true);
  std::vector<float> x(256, 0.0f), y(128, 1.0f);
  exl3_matmul_cpu_opts(int16_options(), o.t, x.data(), 1, y.data());
  for (int64_t j = 0; j < 128; ++j) ASSERT_EQ(y[j], exl3_f16_to_f32(o.t.bias[j])) << j;
}

// One V4.1-shaped MoE step (6 experts, 3 tokens sharing some) with int16 against the exact MoE.
TEST_F(Exl3CpuInt16, MoeMatchesTheExactMoe) {
  std::mt19937 rng(16);
  const int64_t d = 1024, f = 384, n_experts = 8, top_k = 3, n_tokens = 3;
  std::vector<test::OwnedExl3> w(3 * n_experts);
  std::vector<Exl3ExpertWeights> experts(n_experts);
  for (int64_t e = 0; e < n_experts; ++e) {
    test::fill_random_exl3(w[3 * e], d, f, 6, Exl3Codebook::kMul1, rng, 0.03f, false);
    test::fill_random_exl3(w[3 * e + 1], d, f, 6, Exl3Codebook::kMul1, rng, 0.03f, false);
    test::fill_random_exl3(w[3 * e + 2], f, d, 6, Exl3Codebook::kMul1, rng, 0.03f, false);
    experts[e] = {&w[3 * e].t, &w[3 * e + 1].t, &w[3 * e + 2].t};
  }
  std::vector<float> x(n_tokens * d);
  for (auto& v : x) v = std::normal_distribution<float>(0, 1)(rng);
  const std::vector<int32_t> ids = {0, 3, 5, 3, 1, -1, 5, 0, 7};
  const std::vector<float> wts = {0.5f, 0.3f, 0.2f, 0.6f, 0.4f, 0.0f, 0.1f, 0.7f, 0.2f};
  std::vector<float> exact(n_tokens * d, 0.0f);
  exl3_moe_cpu(experts.data(), n_experts, x.data(), n_tokens, ids.data(), wts.data(), top_k, 10.0f, exact.data());
  std::vector<float> first;
  for (size_t threads : {1, 3}) {  // different part splits; the result must not depend on them beyond rounding
    ThreadPool pool(threads);
    std::vector<float> approx(n_tokens * d, 0.0f);
    exl3_moe_cpu(experts.data(), n_experts, x.data(), n_tokens, ids.data(), wts.data(), top_k, 10.0f, approx.data(),
                 &pool, int16_options());
    const Errors e = errors(approx, exact);
    std::printf("  int16 MoE, %zu threads: rel %.2e, max %.2e·RMS against the exact MoE\n", threads, e.rel, e.max_over_rms);
    EXPECT_NE(approx, exact);
    EXPECT_LT(e.rel, 1e-3);
    EXPECT_LT(e.max_over_rms, 5e-3);
    if (first.empty()) first = approx;
    else EXPECT_LT(errors(approx, first).rel, 1e-6) << "1 and 3 threads";
  }
}

}  // namespace
}  // namespace spw
#endif
