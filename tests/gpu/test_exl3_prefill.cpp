// spw_cuda EXL3 prefill (cuda/exl3_prefill.h): the decoded Ŵᵀ must equal the scalar reference decoder
// exl3_decode_inner bit for bit (every codebook value is an fp16; the kernel only moves them), and
// y = x·W against the fp64 reference exl3_matmul_ref for m = 1, 17, 300 on V4.1 expert shapes and
// awkward ones, every codebook, K 2..6, bias on/off. Output guard regions keep their sentinel, no NaN.
// Tolerance: as the small-batch kernels (test_exl3_cuda.cpp): RMS error ≤ 2e-3·RMS(y), max ≤ 2e-2·RMS(y) —
// x is rounded once to fp16 after its rotation; cuBLAS accumulates in fp32.
#if defined(SPW_HAVE_CUDA)
#include "cuda/exl3_prefill.h"
#include "gpu_test_util.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace spw {
namespace {

using gpu_test::upload;

void run_case(int64_t k, int64_t n, int K, Exl3Codebook cb, int64_t m, bool with_bias, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "k=" << k << " n=" << n << " K=" << K << " cb=" << exl3_codebook_name(cb)
                                  << " m=" << m);
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
  Exl3PrefillWorkspace ws;
  ASSERT_TRUE(exl3_prefill_workspace_alloc(ws, k, n, m).ok());

  // Ŵᵀ bit-exact against the scalar decoder (exl3_decode_inner gives Ŵ [k][n] fp16 bits).
  ASSERT_TRUE(exl3_decode_transposed_cuda(d, ws.w_t, nullptr).ok());
  std::vector<uint16_t> w_t(k * n);
  ASSERT_EQ(cudaMemcpy(w_t.data(), ws.w_t, w_t.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  const std::vector<uint16_t> w = exl3_decode_inner(t);
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c)
      ASSERT_EQ(w_t[c * k + r], w[r * n + c]) << "Ŵ[" << r << "][" << c << "]";

  float* dx = upload(x);
  const int64_t guard = 256;
  std::vector<float> yh(m * n + 2 * guard, 3.0e38f);
  float* dy = upload(yh);
  auto st = exl3_prefill_cuda(d, dx, m, dy + guard, ws);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(yh.data(), dy, yh.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < guard; ++i) {
    ASSERT_EQ(yh[i], 3.0e38f);
    ASSERT_EQ(yh[guard + m * n + i], 3.0e38f);
  }
  double rms = 0, e2 = 0, emax = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    const float y = yh[guard + i];
    ASSERT_FALSE(std::isnan(y)) << i;
    const double d_ = double(y) - ref[i];
    rms += double(ref[i]) * ref[i], e2 += d_ * d_, emax = std::max(emax, std::fabs(d_));
  }
  rms = std::sqrt(rms / (m * n));
  EXPECT_LT(std::sqrt(e2 / (m * n)), 2e-3 * rms);
  EXPECT_LT(emax, 2e-2 * rms);
  exl3_prefill_workspace_free(ws);
  cudaFree(const_cast<uint16_t*>(d.trellis)), cudaFree(const_cast<uint16_t*>(d.suh)), cudaFree(const_cast<uint16_t*>(d.svh));
  cudaFree(const_cast<uint16_t*>(d.bias)), cudaFree(dx), cudaFree(dy);
}

TEST(Exl3Prefill, EveryBitrateAndCodebook) {
  SPW_REQUIRE_GPU();
  uint32_t seed = 101;
  for (int K = 2; K <= 6; ++K)
    for (int cb = 0; cb < 3; ++cb, ++seed) run_case(512, 256, K, static_cast<Exl3Codebook>(cb), 17, cb == 1, seed);
}

TEST(Exl3Prefill, RealShapes) {
  SPW_REQUIRE_GPU();
  run_case(5120, 2304, 3, Exl3Codebook::kMul1, 300, false, 111);
  run_case(2304, 5120, 3, Exl3Codebook::kMul1, 1, true, 112);
  run_case(4096, 2048, 4, Exl3Codebook::kMcg, 64, false, 113);
}

TEST(Exl3Prefill, AwkwardSizes) {
  SPW_REQUIRE_GPU();
  run_case(128, 128, 2, Exl3Codebook::k3Inst, 1, true, 121);
  run_case(1152, 640, 5, Exl3Codebook::kMul1, 7, false, 122);
}

}  // namespace
}  // namespace spw
#endif
