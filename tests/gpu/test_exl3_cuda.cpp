// spw_cuda EXL3 GEMM (cuda/exl3_gemm.h) against the fp64 reference exl3_matmul_ref: V4.1 expert shapes
// (5120×2304, 2304×5120), 4096×2048, 8192×8192 and awkward ones, K 2..6, every codebook, m 1..100
// (incl. 9..16 rows, several 16-token chunks and a 64-row launch plus a remainder), bias on/off, both
// kernel paths (Exl3GemmPath) and the bulk path's 16- and 64-row launches. Output guard regions must keep their
// sentinel, no NaN, and a second identical call must agree to 1e-5 (the self-cleaning workspace; fp32
// atomics make the summation order, hence the last bits, vary between calls).
// Tolerance: RMS error ≤ 2e-3·RMS(y), max ≤ 2e-2·RMS(y) — x is rounded to fp16 once after its
// rotation (≈2^-12 relative per element), everything else is fp32.
// Built into spw_gpu_tests (not run by ctest); scripts/gpu_test.sh runs it on the GPU machine.
#if defined(SPW_HAVE_CUDA)
#include "cuda/exl3_gemm.h"
#include "gpu_test_util.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace spw {
namespace {

using gpu_test::upload;

void run_case(int64_t k, int64_t n, int K, Exl3Codebook cb, int64_t m, bool with_bias, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "k=" << k << " n=" << n << " K=" << K << " cb=" << exl3_codebook_name(cb) << " m=" << m);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<uint16_t> trellis(static_cast<size_t>(k / 16) * (n / 16) * 16 * K);
  for (auto& w : trellis) w = rng() & 0xffff;
  Exl3Tensor t;
  t.k = k, t.n = n, t.bits.k_x2 = 2 * K, t.codebook = cb, t.trellis = trellis.data();
  t.suh.resize(k), t.svh.resize(n);
  for (auto& v : t.suh) v = exl3_f64_to_f16(0.03 * nd(rng));
  for (auto& v : t.svh) v = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * (1 + 0.2 * nd(rng)));
  if (with_bias) {
    t.bias.resize(n);
    for (auto& v : t.bias) v = exl3_f64_to_f16(0.1 * nd(rng));
  }
  std::vector<float> x(m * k);
  for (auto& v : x) v = nd(rng);
  std::vector<float> ref(m * n);
  exl3_matmul_ref(t, x.data(), m, ref.data());

  Exl3CudaTensor d;
  d.trellis = upload(trellis), d.suh = upload(t.suh), d.svh = upload(t.svh);
  d.bias = with_bias ? upload(t.bias) : nullptr;
  d.k = k, d.n = n, d.bits = t.bits, d.codebook = cb;
  ASSERT_TRUE(exl3_cuda_supports(d));
  float* dx = upload(x);
  const int64_t guard = 256;
  std::vector<float> yh(m * n + 2 * guard, 3.0e38f);
  float* dy = upload(yh);
  Exl3CudaWorkspace ws;
  ASSERT_TRUE(exl3_cuda_workspace_alloc(ws, k, n).ok());
  // kXSmem; kBulk with 64 rows per launch (the default); kBulk with 16 rows per launch.
  for (int variant = 0; variant < 3; ++variant) {
  const Exl3GemmPath path = variant == 0 ? Exl3GemmPath::kXSmem : Exl3GemmPath::kBulk;
  ws.rows_per_launch = variant == 2 ? 16 : 0;
  SCOPED_TRACE(testing::Message() << exl3_gemm_path_name(path) << " rows per launch " << ws.rows_per_launch);
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    auto st = exl3_gemm_cuda(d, dx, m, dy + guard, ws, nullptr, path);
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(yh.data(), dy, yh.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < guard; ++i) {
      ASSERT_EQ(yh[i], 3.0e38f);
      ASSERT_EQ(yh[guard + m * n + i], 3.0e38f);
    }
    std::vector<float> y(yh.begin() + guard, yh.begin() + guard + m * n);
    if (rep == 0) {
      first = y;
    } else {  // fp32 atomics sum in varying order, so not bit-identical; a stale workspace would double y
      double d2 = 0, y2 = 0;
      for (size_t i = 0; i < y.size(); ++i) d2 += double(y[i] - first[i]) * (y[i] - first[i]), y2 += double(y[i]) * y[i];
      EXPECT_LT(std::sqrt(d2 / y2), 1e-5) << "second call differs";
    }
  }
  double rms = 0, e2 = 0, emax = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    ASSERT_FALSE(std::isnan(first[i])) << i;
    double d_ = double(first[i]) - ref[i];
    rms += double(ref[i]) * ref[i], e2 += d_ * d_, emax = std::max(emax, std::fabs(d_));
  }
  rms = std::sqrt(rms / (m * n));
  EXPECT_LT(std::sqrt(e2 / (m * n)), 2e-3 * rms);
  EXPECT_LT(emax, 2e-2 * rms);
  }
  exl3_cuda_workspace_free(ws);
  cudaFree(const_cast<uint16_t*>(d.trellis)), cudaFree(const_cast<uint16_t*>(d.suh)), cudaFree(const_cast<uint16_t*>(d.svh));
  cudaFree(const_cast<uint16_t*>(d.bias)), cudaFree(dx), cudaFree(dy);
}

TEST(Exl3Cuda, EveryBitrateAndCodebook) {
  SPW_REQUIRE_GPU();
  uint32_t seed = 1;
  for (int K = 2; K <= 6; ++K)
    for (int cb = 0; cb < 3; ++cb, ++seed) run_case(512, 256, K, static_cast<Exl3Codebook>(cb), 1 + (seed % 12), cb == 2, seed);
}

TEST(Exl3Cuda, RealShapes) {
  SPW_REQUIRE_GPU();
  run_case(5120, 2304, 3, Exl3Codebook::kMul1, 1, false, 11);
  run_case(2304, 5120, 3, Exl3Codebook::kMcg, 8, false, 12);
  run_case(4096, 2048, 3, Exl3Codebook::k3Inst, 16, true, 13);
  run_case(5120, 2304, 4, Exl3Codebook::kMul1, 64, false, 14);
  run_case(8192, 8192, 3, Exl3Codebook::kMul1, 1, false, 15);
}

TEST(Exl3Cuda, AwkwardSizes) {
  SPW_REQUIRE_GPU();
  run_case(128, 128, 2, Exl3Codebook::kMcg, 7, true, 21);
  run_case(384, 640, 5, Exl3Codebook::k3Inst, 17, false, 22);
  run_case(1152, 128, 6, Exl3Codebook::kMul1, 33, true, 23);
  run_case(128, 1920, 4, Exl3Codebook::kMcg, 9, false, 24);
  run_case(640, 384, 3, Exl3Codebook::kMul1, 100, true, 25);   // a 64-row launch, then 36 rows
  run_case(2304, 512, 6, Exl3Codebook::k3Inst, 70, false, 26);  // K=6's ring next to 64 rows of x
}

// round_out_bf16 must equal rounding the unrounded output afterwards, bit for bit (the engine relies on
// it), for a 1-row and a 64-row launch.
TEST(Exl3Cuda, RoundedOutputIsBf16OfUnrounded) {
  SPW_REQUIRE_GPU();
  const int64_t k = 256, n = 128;
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0, 1);
  std::vector<uint16_t> trellis(static_cast<size_t>(k / 16) * (n / 16) * 16 * 3), suh(k), svh(n);
  for (auto& w : trellis) w = rng() & 0xffff;
  for (auto& v : suh) v = exl3_f64_to_f16(0.03 * nd(rng));
  for (auto& v : svh) v = exl3_f64_to_f16(1 + 0.2 * nd(rng));
  Exl3CudaTensor d;
  d.trellis = upload(trellis), d.suh = upload(suh), d.svh = upload(svh);
  d.k = k, d.n = n, d.bits.k_x2 = 6, d.codebook = Exl3Codebook::kMul1;
  Exl3CudaWorkspace ws;
  ASSERT_TRUE(exl3_cuda_workspace_alloc(ws, k, n).ok());
  for (int64_t m : {1, 40}) {
    std::vector<float> x(m * k);
    for (auto& v : x) v = nd(rng);
    float* dx = upload(x);
    std::vector<float> yh(m * n);
    float* dy = upload(yh);
    // k = 256 is at most two k splits: two fp32 addends sum the same in either order, so both calls
    // see the same unrounded values.
    std::vector<float> plain(m * n), rounded(m * n);
    ASSERT_TRUE(exl3_gemm_cuda(d, dx, m, dy, ws, nullptr, Exl3GemmPath::kBulk, false).ok());
    ASSERT_EQ(cudaMemcpy(plain.data(), dy, plain.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_TRUE(exl3_gemm_cuda(d, dx, m, dy, ws, nullptr, Exl3GemmPath::kBulk, true).ok());
    ASSERT_EQ(cudaMemcpy(rounded.data(), dy, rounded.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    int rounded_away = 0;
    for (int64_t i = 0; i < m * n; ++i) {
      uint32_t b;
      std::memcpy(&b, &plain[i], 4);
      b = ((b + 0x7fffu + ((b >> 16) & 1u)) >> 16) << 16;  // round to nearest even bf16
      float want;
      std::memcpy(&want, &b, 4);
      ASSERT_EQ(rounded[i], want) << "m=" << m << " i=" << i;
      rounded_away += rounded[i] != plain[i];
    }
    EXPECT_GT(rounded_away, m * n / 2) << "the rounding did nothing";
    cudaFree(dx), cudaFree(dy);
  }
  exl3_cuda_workspace_free(ws);
  cudaFree(const_cast<uint16_t*>(d.trellis)), cudaFree(const_cast<uint16_t*>(d.suh)), cudaFree(const_cast<uint16_t*>(d.svh));
}

TEST(Exl3Cuda, RejectsUnsupported) {
  Exl3CudaTensor d;
  d.k = 256, d.n = 256, d.bits.k_x2 = 5, d.codebook = Exl3Codebook::kMul1;
  uint16_t dummy = 0;
  d.trellis = d.suh = d.svh = &dummy;
  EXPECT_FALSE(exl3_cuda_supports(d));  // K = 2.5
  d.bits.k_x2 = 14;
  EXPECT_FALSE(exl3_cuda_supports(d));  // K = 7
  Exl3CudaWorkspace ws;
  EXPECT_FALSE(exl3_gemm_cuda(d, nullptr, 1, nullptr, ws).ok());
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
