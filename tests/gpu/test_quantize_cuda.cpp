// The CUDA EXL3 quantizer (quantize/cuda/exl3_quantize_cuda.h) end to end against the CPU one
// (exl3_quantize_tensor), on a 256×512 tensor with a real-ish Hessian (correlated features,
// uneven scales) and with the identity:
//   * without LDLQ and refit, trellis, suh and svh are bit-identical and the proxy errors agree to
//     1e-9 relative (the proxy error is a cuBLAS GEMM on the GPU, loops on the CPU);
//   * with LDLQ and refit (the default), cuSOLVER's Cholesky differs from the CPU's in the last
//     bits, the error feedback lets tiles diverge, and the two runs are two equally good
//     quantizations: their proxy errors must agree within 5 % relative (512 tiles, per-tile error
//     spread ~30 % → ~1.3 % standard deviation of the total; 5 % is about 4σ). In practice the
//     result may well be identical: on the CPU, perturbing this H by 1e-7 relative left the K=2
//     trellis bit-identical (the fp32 targets absorb the difference); the test prints the share of
//     identical trellis words.
//   * always: the CUDA result decoded on the CPU (exl3_weight_ref + exl3_proxy_error) reproduces the
//     CUDA-reported proxy error to 1e-6 relative, i.e. the packed trellis and fp16 scales are what
//     the quantizer measured.
//   * a global-scale multiplier (ScaleMultBitExactWithCpu) keeps the plain path bit-exact;
//   * the candidate search (regularisation strengths, signs and global-scale multipliers; the lowest proxy error kept)
//     keeps the same candidate as the CPU (CandidateSearchSameChoiceAsCpu).
// DISABLED_SlowCpu_V41ExpertShape does the same at 2304×5120, K=3 (one tensor; the CPU side takes
// ~15 min single-threaded): run it with --gtest_also_run_disabled_tests --gtest_filter='*V41Expert*'.
// There the tolerance is 1 % (46,080 tiles).
// Built into spw_gpu_tests (not run by ctest); a missing GPU is a failure, not a skip.
#if defined(SPW_HAVE_CUDA) && defined(SPW_HAVE_QUANTIZE_CUDA)
#include "quantize/cuda/exl3_quantize_cuda.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "formats/exl3.h"
#include "gpu_test_util.h"
#include "quantize/exl3_quantize.h"

namespace spw::quant {
namespace {

struct Problem {
  int64_t k = 0, n = 0;
  std::vector<float> w;
  std::vector<double> h;
};

// W with uneven column and row scales and a few outliers; H = XᵀX/m of correlated, unevenly
// scaled features (rank ≥ k: m = 2k rows).
Problem make_problem(int64_t k, int64_t n, uint32_t seed) {
  Problem p;
  p.k = k;
  p.n = n;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> cs(static_cast<size_t>(n)), rs(static_cast<size_t>(k));
  for (auto& v : cs) v = 0.02f * std::exp(0.3f * nd(rng));
  for (auto& v : rs) v = std::exp(0.2f * nd(rng));
  p.w.resize(size_t(k * n));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) p.w[size_t(i * n + j)] = rs[size_t(i)] * cs[size_t(j)] * nd(rng);
  for (int o = 0; o < 8; ++o) p.w[size_t(rng() % uint32_t(k * n))] *= 8;
  const int64_t m = 2 * k;
  std::vector<float> x(size_t(m * k)), fs(static_cast<size_t>(k));
  for (auto& v : fs) v = std::exp(0.7f * nd(rng));
  for (int64_t t = 0; t < m; ++t) {
    const float c0 = nd(rng), c1 = nd(rng);
    for (int64_t a = 0; a < k; ++a)
      x[size_t(t * k + a)] = fs[size_t(a)] * (nd(rng) + 0.6f * (a % 2 ? c0 : c1));
  }
  p.h.assign(size_t(k * k), 0.0);
  hessian_add_outer(p.h, x.data(), nullptr, int(m), int(k));
  for (auto& v : p.h) v /= double(m);
  return p;
}

// The CUDA result read back through the reference decoder reproduces its own proxy error.
void expect_self_consistent(const Problem& p, const QuantizedTensor& q, bool identity) {
  const std::vector<float> wq = exl3_weight_ref(q.view("cuda"));
  const double pe = exl3_proxy_error(p.w.data(), wq.data(), p.k, p.n, identity ? std::vector<double>{} : p.h);
  EXPECT_NEAR(pe, q.proxy_err, 1e-6 * q.proxy_err) << "proxy error of the decoded CUDA result";
}

void compare(const Problem& p, int bits, Exl3Codebook cb, bool identity, bool ldlq_refit, double rel_tol) {
  SCOPED_TRACE(testing::Message() << "k=" << p.k << " n=" << p.n << " K=" << bits << " cb=" << exl3_codebook_name(cb)
                                  << (identity ? " identity" : " calibrated") << (ldlq_refit ? " ldlq+refit" : " plain"));
  QuantizeParams qp;
  qp.bits = bits;
  qp.codebook = cb;
  qp.seed = 42;
  qp.ldlq = ldlq_refit;
  qp.refit = ldlq_refit;
  qp.alternatives.clear();  // one candidate (CandidateSearchSameChoiceAsCpu covers the search)
  const std::vector<double> h = identity ? std::vector<double>{} : p.h;
  auto cpu = exl3_quantize_tensor(p.w.data(), p.k, p.n, h, qp);
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  auto gpu = exl3_quantize_tensor_cuda(p.w.data(), p.k, p.n, h, qp);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  ASSERT_EQ(gpu->trellis.size(), cpu->trellis.size());
  ASSERT_EQ(gpu->suh.size(), cpu->suh.size());
  ASSERT_EQ(gpu->svh.size(), cpu->svh.size());
  size_t same_words = 0;
  for (size_t i = 0; i < cpu->trellis.size(); ++i) same_words += gpu->trellis[i] == cpu->trellis[i];
  std::printf("    K=%d %s %s %s: proxy err cpu %.6g (before refit %.6g, %.1fs) cuda %.6g (before refit %.6g, %.2fs); "
              "global scale cpu %.6f cuda %.6f; identical trellis words %.1f%%\n",
              bits, exl3_codebook_name(cb), identity ? "identity" : "calibrated", ldlq_refit ? "ldlq+refit" : "plain",
              cpu->proxy_err, cpu->proxy_err_before_refit, cpu->seconds, gpu->proxy_err, gpu->proxy_err_before_refit,
              gpu->seconds, cpu->global_scale, gpu->global_scale, 100.0 * double(same_words) / double(cpu->trellis.size()));
  EXPECT_EQ(gpu->fell_back_to_identity, cpu->fell_back_to_identity);
  EXPECT_EQ(gpu->global_scale, cpu->global_scale) << "global-scale search (bit-exact rotation and trellis)";
  if (!ldlq_refit) {
    for (size_t i = 0; i < cpu->trellis.size(); ++i)
      ASSERT_EQ(gpu->trellis[i], cpu->trellis[i]) << "trellis word " << i << " (tile " << i / size_t(16 * bits) << ")";
    for (size_t i = 0; i < cpu->suh.size(); ++i) ASSERT_EQ(gpu->suh[i], cpu->suh[i]) << "suh[" << i << "]";
    for (size_t i = 0; i < cpu->svh.size(); ++i) ASSERT_EQ(gpu->svh[i], cpu->svh[i]) << "svh[" << i << "]";
  }
  EXPECT_NEAR(gpu->proxy_err, cpu->proxy_err, rel_tol * cpu->proxy_err);
  expect_self_consistent(p, *gpu, identity);
}

TEST(QuantizeCuda, PlainBitExactWithCpu) {
  SPW_REQUIRE_GPU();
  const Problem p = make_problem(256, 512, 1);
  for (bool identity : {false, true}) compare(p, 3, Exl3Codebook::kMul1, identity, false, 1e-9);
  compare(p, 2, Exl3Codebook::kMcg, false, false, 1e-9);
}

TEST(QuantizeCuda, LdlqRefitSameProxyErrorAsCpu) {
  SPW_REQUIRE_GPU();
  const Problem p = make_problem(256, 512, 2);
  for (int bits : {2, 3, 4}) compare(p, bits, Exl3Codebook::kMul1, false, true, 0.05);
  compare(p, 3, Exl3Codebook::k3Inst, true, true, 0.05);
}

TEST(QuantizeCuda, OddShapesAndK) {
  SPW_REQUIRE_GPU();
  const Problem p = make_problem(128, 384, 3);
  compare(p, 1, Exl3Codebook::kMul1, false, false, 1e-9);
  compare(p, 5, Exl3Codebook::kMul1, false, false, 1e-9);
  compare(p, 8, Exl3Codebook::kMul1, false, false, 1e-9);
}

// The candidate search (default on: global-scale multipliers and signs): the GPU tries the CPU's
// candidates in the CPU's order and keeps the same one. The candidates' proxy errors differ by
// ~0.5-2 % while the GPU reproduced the CPU's single-candidate errors exactly in the 18:08 H200 run
// (identical trellis words), so the choice must agree; the printed errors show how close a
// disagreement was.
TEST(QuantizeCuda, CandidateSearchSameChoiceAsCpu) {
  SPW_REQUIRE_GPU();
  const Problem p = make_problem(256, 512, 6);
  for (bool ldlq_refit : {true, false}) {
    SCOPED_TRACE(testing::Message() << (ldlq_refit ? "ldlq+refit" : "plain"));
    QuantizeParams qp;
    qp.bits = 3;
    qp.seed = 42;
    qp.ldlq = ldlq_refit;
    qp.refit = ldlq_refit;
    auto cpu = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
    ASSERT_TRUE(cpu.ok()) << cpu.error().message;
    auto gpu = exl3_quantize_tensor_cuda(p.w.data(), p.k, p.n, p.h, qp);
    ASSERT_TRUE(gpu.ok()) << gpu.error().message;
    std::printf("    %d candidates: kept cpu #%d (sigma_reg %g, seed %llu, scale ×%g) cuda #%d (sigma_reg %g, seed %llu, "
                "scale ×%g); proxy err cpu %.8g cuda %.8g\n", cpu->candidates, cpu->candidate, cpu->sigma_reg,
                (unsigned long long)cpu->seed, cpu->scale_mult, gpu->candidate, gpu->sigma_reg,
                (unsigned long long)gpu->seed, gpu->scale_mult, cpu->proxy_err, gpu->proxy_err);
    EXPECT_EQ(cpu->candidates, 4);
    EXPECT_EQ(gpu->candidates, 4);
    EXPECT_EQ(gpu->candidate, cpu->candidate) << "kept candidate";
    EXPECT_EQ(gpu->seed, cpu->seed);
    EXPECT_EQ(gpu->sigma_reg, cpu->sigma_reg);
    EXPECT_EQ(gpu->scale_mult, cpu->scale_mult);
    EXPECT_NEAR(gpu->proxy_err, cpu->proxy_err, (ldlq_refit ? 0.05 : 1e-9) * cpu->proxy_err);
    expect_self_consistent(p, *gpu, false);
  }
  auto id = exl3_quantize_tensor_cuda(p.w.data(), p.k, p.n, {}, QuantizeParams{});
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(id->candidates, 1) << "identity H: one candidate";
  EXPECT_EQ(id->sigma_reg, 0.0);
}

// A global-scale multiplier (QuantizeCandidate::scale_mult): the GPU scales the tile-search result
// exactly like the CPU, so without LDLQ/refit the trellis and scales stay bit-identical.
TEST(QuantizeCuda, ScaleMultBitExactWithCpu) {
  SPW_REQUIRE_GPU();
  const Problem p = make_problem(256, 256, 8);
  QuantizeParams qp;
  qp.bits = 2;
  qp.seed = 42;
  qp.ldlq = false;
  qp.refit = false;
  qp.alternatives.clear();
  auto base = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
  ASSERT_TRUE(base.ok()) << base.error().message;
  for (double mult : {0.97, 1.03}) {
    SCOPED_TRACE(testing::Message() << "scale_mult " << mult);
    qp.scale_mult = mult;
    auto cpu = exl3_quantize_tensor(p.w.data(), p.k, p.n, p.h, qp);
    ASSERT_TRUE(cpu.ok()) << cpu.error().message;
    auto gpu = exl3_quantize_tensor_cuda(p.w.data(), p.k, p.n, p.h, qp);
    ASSERT_TRUE(gpu.ok()) << gpu.error().message;
    std::printf("    scale_mult %.2f: global scale base %.6f cpu %.6f cuda %.6f; proxy err cpu %.8g cuda %.8g\n", mult,
                base->global_scale, cpu->global_scale, gpu->global_scale, cpu->proxy_err, gpu->proxy_err);
    EXPECT_EQ(cpu->global_scale, base->global_scale * mult);
    EXPECT_EQ(gpu->global_scale, cpu->global_scale);
    EXPECT_EQ(gpu->scale_mult, mult);
    ASSERT_EQ(gpu->trellis.size(), cpu->trellis.size());
    for (size_t i = 0; i < cpu->trellis.size(); ++i)
      ASSERT_EQ(gpu->trellis[i], cpu->trellis[i]) << "trellis word " << i << " (tile " << i / size_t(16 * qp.bits) << ")";
    EXPECT_EQ(gpu->suh, cpu->suh);
    EXPECT_EQ(gpu->svh, cpu->svh);
    EXPECT_NEAR(gpu->proxy_err, cpu->proxy_err, 1e-9 * cpu->proxy_err);
  }
}

TEST(QuantizeCuda, BadInputSameErrorsAsCpu) {
  SPW_REQUIRE_GPU();
  Problem p = make_problem(128, 128, 4);
  QuantizeParams qp;
  EXPECT_FALSE(exl3_quantize_tensor_cuda(p.w.data(), 100, 128, {}, qp).ok());
  qp.bits = 9;
  EXPECT_FALSE(exl3_quantize_tensor_cuda(p.w.data(), p.k, p.n, {}, qp).ok());
  qp.bits = 3;
  p.w[77] = NAN;
  EXPECT_FALSE(exl3_quantize_tensor_cuda(p.w.data(), p.k, p.n, {}, qp).ok());
  p.w[77] = 0;
  auto z = exl3_quantize_tensor_cuda(p.w.data(), p.k, p.n, std::vector<double>(size_t(p.k * p.k), 0.0), qp);
  ASSERT_TRUE(z.ok()) << z.error().message;
  EXPECT_TRUE(z->fell_back_to_identity);
}

TEST(QuantizeCuda, DISABLED_SlowCpu_V41ExpertShape) {
  SPW_REQUIRE_GPU();
  const Problem p = make_problem(2304, 5120, 5);
  compare(p, 3, Exl3Codebook::kMul1, false, true, 0.01);
}

}  // namespace
}  // namespace spw::quant
#endif
