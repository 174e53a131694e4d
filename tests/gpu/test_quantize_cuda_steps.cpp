// GPU steps of the EXL3 quantizer (quantize/cuda/exl3_steps_cuda.h) against the CPU:
//   * Hessian accumulation vs hessian_add_outer (fp64 both; cuBLAS sums in another order):
//     |ΔH| ≤ 1e-12·Σ_t ω|x_a x_b| per entry (a few fp64 ulps of the summed magnitudes).
//   * block-128 Hadamards (left and right) vs the CPU's butterflies: bit-exact.
//   * the rotated Hessian (regularised H, signs/scales su, both Hadamards) vs the CPU's operations
//     in the CPU's order: bit-exact.
//   * block LDL vs block_ldl: |ΔL| ≤ 1e-9·max(1, |L|) on the strictly-lower-block part (the CPU's
//     Cholesky and cuSOLVER's round differently; the test Hessians have condition number ≲ 1e4, so
//     the factors agree to ~1e-12 relative), and a not-PD matrix is reported as such.
//   * LDLQ targets (error feedback summed in the CPU's jr order, then rounded to fp32): bit-exact.
//   * dot / trace_form: 1e-12 relative.
// Built into spw_gpu_tests (not run by ctest); a missing GPU is a failure, not a skip.
#if defined(SPW_HAVE_CUDA) && defined(SPW_HAVE_QUANTIZE_CUDA)
#include "gpu_test_util.h"
#include "quantize/cuda/exl3_steps_cuda.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/exl3.h"
#include "quantize/exl3_quantize.h"

namespace spw::quant {
namespace {

template <class T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, v.size() * sizeof(T) + 64), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  // A pageable cudaMemcpy may return before its DMA lands, and the kernels run on the context's
  // non-blocking stream, which does not wait for the legacy stream: finish the copy first.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d;
}
template <class T>
std::vector<T> download(const T* d, size_t count) {
  std::vector<T> v(count);
  EXPECT_EQ(cudaMemcpy(v.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// A Hessian like a real one: X = Z·A with correlated features and uneven scales, H = XᵀX/m + 1e-3 I.
std::vector<double> realish_hessian(int64_t k, int64_t m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(size_t(m * k));
  std::vector<float> scale(static_cast<size_t>(k));
  for (auto& s : scale) s = std::exp(0.7f * nd(rng));
  for (int64_t t = 0; t < m; ++t) {
    const float common = nd(rng);
    for (int64_t a = 0; a < k; ++a) x[size_t(t * k + a)] = scale[size_t(a)] * (nd(rng) + 0.5f * common);
  }
  std::vector<double> h(size_t(k * k), 0.0);
  hessian_add_outer(h, x.data(), nullptr, int(m), int(k));
  for (auto& v : h) v /= double(m);
  for (int64_t i = 0; i < k; ++i) h[size_t(i * k + i)] += 1e-3;
  return h;
}

void had128_ref(double* v, int64_t stride) {
  for (int s = 1; s < 128; s <<= 1)
    for (int i = 0; i < 128; ++i)
      if (!(i & s)) {
        const double a = v[i * stride], b = v[(i + s) * stride];
        v[i * stride] = a + b;
        v[(i + s) * stride] = a - b;
      }
  const double r = 1.0 / std::sqrt(128.0);
  for (int i = 0; i < 128; ++i) v[i * stride] *= r;
}

class QuantizeCudaSteps : public testing::Test {
 protected:
  void SetUp() override {
    SPW_REQUIRE_GPU();
    auto st = quant_cuda_context_create(ctx_);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  void TearDown() override { quant_cuda_context_destroy(ctx_); }
  QuantCudaContext ctx_;
};

TEST_F(QuantizeCudaSteps, HessianMatchesCpu) {
  for (auto [m, d, weighted] : {std::tuple{1, 128, false}, {37, 256, true}, {1000, 384, true}, {513, 128, false}}) {
    SCOPED_TRACE(testing::Message() << "m=" << m << " d=" << d << " weighted=" << weighted);
    std::mt19937 rng(uint32_t(m + d));
    std::normal_distribution<float> nd(0, 2);
    std::uniform_real_distribution<float> ud(0.05f, 1.f);
    std::vector<float> x(size_t(m) * d), w(static_cast<size_t>(m));
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = ud(rng);
    std::vector<double> h0(size_t(d) * d);
    for (auto& v : h0) v = 0.01 * nd(rng);  // accumulate onto existing contents
    std::vector<double> ref = h0, mag(size_t(d) * d, 0.0);
    hessian_add_outer(ref, x.data(), weighted ? w.data() : nullptr, m, d);
    for (int t = 0; t < m; ++t)
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b)
          mag[size_t(a) * d + b] += std::fabs((weighted ? w[size_t(t)] : 1.f) * double(x[size_t(t) * d + a]) * x[size_t(t) * d + b]);
    float* dx = upload(x);
    float* dw = upload(w);
    double* dh = upload(h0);
    auto st = hessian_accumulate_cuda(ctx_, dx, weighted ? dw : nullptr, m, d, dh);
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(cudaStreamSynchronize(ctx_.stream), cudaSuccess);
    const std::vector<double> got = download(dh, ref.size());
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_LE(std::fabs(got[i] - ref[i]), 1e-12 * (mag[i] + std::fabs(h0[i])) + 1e-300)
          << "H[" << i / size_t(d) << "][" << i % size_t(d) << "] cuda " << got[i] << " cpu " << ref[i];
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dh);
  }
}

TEST_F(QuantizeCudaSteps, HadamardsBitExact) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{128, 128}, {256, 384}, {384, 1024}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " cols=" << cols);
    std::mt19937 rng(uint32_t(rows * 7 + cols));
    std::normal_distribution<double> nd(0, 1);
    std::vector<double> x(size_t(rows * cols));
    for (auto& v : x) v = nd(rng);
    std::vector<double> left = x, right = x;
    for (int64_t b = 0; b < rows; b += 128)
      for (int64_t j = 0; j < cols; ++j) had128_ref(&left[size_t(b * cols + j)], cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t b = 0; b < cols; b += 128) had128_ref(&right[size_t(i * cols + b)], 1);
    double* d = upload(x);
    had_left_cuda(ctx_, d, rows, cols);
    ASSERT_EQ(cudaStreamSynchronize(ctx_.stream), cudaSuccess);
    std::vector<double> got = download(d, x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], left[i]) << "left, element " << i;
    ASSERT_EQ(cudaMemcpy(d, x.data(), x.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // see upload()
    had_right_cuda(ctx_, d, rows, cols);
    ASSERT_EQ(cudaStreamSynchronize(ctx_.stream), cudaSuccess);
    got = download(d, x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], right[i]) << "right, element " << i;
    cudaFree(d);
  }
}

TEST_F(QuantizeCudaSteps, HessianRotationBitExact) {
  const int64_t k = 384;
  std::vector<double> h = realish_hessian(k, 2 * k, 9);
  double mean_diag = 0;
  for (int64_t i = 0; i < k; ++i) mean_diag += h[size_t(i * k + i)];
  mean_diag /= double(k);
  for (int64_t i = 0; i < k; ++i) h[size_t(i * k + i)] += 0.025 * mean_diag;  // regularisation (step 1)
  std::mt19937 rng(13);
  std::normal_distribution<double> nd(0, 1);
  std::vector<double> su(static_cast<size_t>(k));
  for (auto& v : su) v = ((rng() & 1) ? -1.0 : 1.0) * std::exp(0.3 * nd(rng)) / 1.24;
  std::vector<double> ref = h;  // exl3_quantize.cpp step 4
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) ref[size_t(i * k + j)] *= su[size_t(i)] * su[size_t(j)];
  for (int64_t b = 0; b < k; b += 128)
    for (int64_t j = 0; j < k; ++j) had128_ref(&ref[size_t(b * k + j)], k);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t b = 0; b < k; b += 128) had128_ref(&ref[size_t(i * k + b)], 1);
  double *dh = upload(h), *dsu = upload(su), *dhi = nullptr;
  ASSERT_EQ(cudaMalloc(&dhi, h.size() * 8), cudaSuccess);
  hessian_rotate_cuda(ctx_, dh, dsu, k, dhi);
  ASSERT_EQ(cudaStreamSynchronize(ctx_.stream), cudaSuccess);
  const std::vector<double> got = download(dhi, h.size());
  for (size_t i = 0; i < h.size(); ++i)
    ASSERT_EQ(got[i], ref[i]) << "hi[" << i / size_t(k) << "][" << i % size_t(k) << "]";
  cudaFree(dh);
  cudaFree(dsu);
  cudaFree(dhi);
}

TEST_F(QuantizeCudaSteps, BlockLdlMatchesCpu) {
  for (int64_t k : {int64_t(128), int64_t(512)}) {
    SCOPED_TRACE(testing::Message() << "k=" << k);
    const std::vector<double> h = realish_hessian(k, 4 * k, uint32_t(k));
    auto ref = block_ldl(h, k);
    ASSERT_TRUE(ref.ok());
    double* dh = upload(h);
    double* dl = nullptr;
    ASSERT_EQ(cudaMalloc(&dl, size_t(k * k) * 8), cudaSuccess);
    bool not_pd = true;
    auto st = block_ldl_cuda(ctx_, dh, k, dl, &not_pd);
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_FALSE(not_pd);
    ASSERT_EQ(cudaStreamSynchronize(ctx_.stream), cudaSuccess);
    const std::vector<double> got = download(dl, size_t(k * k));
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < (i / 16) * 16; ++j) {
        const double r = (*ref)[size_t(i * k + j)];
        ASSERT_LE(std::fabs(got[size_t(i * k + j)] - r), 1e-9 * std::max(1.0, std::fabs(r)))
            << "L[" << i << "][" << j << "] cuda " << got[size_t(i * k + j)] << " cpu " << r;
      }
    // Not positive definite: a negative diagonal entry.
    std::vector<double> bad = h;
    bad[size_t(5 * k + 5)] = -1;
    ASSERT_EQ(cudaMemcpy(dh, bad.data(), bad.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // see upload()
    st = block_ldl_cuda(ctx_, dh, k, dl, &not_pd);
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_TRUE(not_pd);
    EXPECT_FALSE(block_ldl(bad, k).ok());
    cudaFree(dh);
    cudaFree(dl);
  }
}

TEST_F(QuantizeCudaSteps, LdlqTargetsBitExact) {
  const int64_t k = 256, n = 384;
  const std::vector<double> h = realish_hessian(k, 1024, 7);
  auto l = block_ldl(h, k);
  ASSERT_TRUE(l.ok());
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(0, 1);
  std::vector<double> t(size_t(k * n)), delta(size_t(k * n));
  for (auto& v : t) v = nd(rng);
  for (auto& v : delta) v = 0.1 * nd(rng);
  double *dt = upload(t), *dl = upload(*l), *dd = upload(delta);
  float* dtg = nullptr;
  ASSERT_EQ(cudaMalloc(&dtg, size_t(16 * n) * 4), cudaSuccess);
  for (int64_t r0 : {k - 16, int64_t(112), int64_t(0)}) {
    for (bool feedback : {true, false}) {
      SCOPED_TRACE(testing::Message() << "r0=" << r0 << " feedback=" << feedback);
      ldlq_targets_cuda(ctx_, dt, feedback ? dl : nullptr, dd, k, n, r0, dtg);
      ASSERT_EQ(cudaStreamSynchronize(ctx_.stream), cudaSuccess);
      const std::vector<float> got = download(dtg, size_t(16 * n));
      // The CPU quantizer's step 7, then encode_tile_rowmajor's permutation.
      std::vector<double> target(size_t(16 * n));
      for (int r = 0; r < 16; ++r)
        for (int64_t j = 0; j < n; ++j) target[size_t(r * n + j)] = t[size_t((r0 + r) * n + j)];
      if (feedback)
        for (int64_t jr = r0 + 16; jr < k; ++jr)
          for (int r = 0; r < 16; ++r) {
            const double coef = (*l)[size_t(jr * k + r0 + r)];
            if (coef == 0) continue;
            for (int64_t j = 0; j < n; ++j) target[size_t(r * n + j)] += coef * delta[size_t(jr * n + j)];
          }
      for (int64_t tn = 0; tn < n / 16; ++tn)
        for (int p = 0; p < 256; ++p) {
          const float want = float(target[size_t(exl3_perm_row(p) * n + tn * 16 + exl3_perm_col(p))]);
          ASSERT_EQ(got[size_t(tn * 256 + p)], want) << "tile " << tn << " position " << p;
        }
    }
  }
  cudaFree(dt);
  cudaFree(dl);
  cudaFree(dd);
  cudaFree(dtg);
}

TEST_F(QuantizeCudaSteps, TraceFormMatchesCpu) {
  const int64_t k = 256, n = 384;
  const std::vector<double> h = realish_hessian(k, 1024, 11);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> w(size_t(k * n)), wq(size_t(k * n));
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = nd(rng);
    wq[i] = w[i] + 0.05f * nd(rng);
  }
  std::vector<double> dd(w.size()), wd(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    wd[i] = w[i];
    dd[i] = double(wq[i]) - double(w[i]);
  }
  double *dh = upload(h), *dwd = upload(wd), *ddd = upload(dd), *scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, wd.size() * 8), cudaSuccess);
  for (bool identity : {false, true}) {
    SCOPED_TRACE(testing::Message() << "identity=" << identity);
    auto num = trace_form_cuda(ctx_, identity ? nullptr : dh, ddd, ddd, k, n, scratch);
    auto den = trace_form_cuda(ctx_, identity ? nullptr : dh, dwd, dwd, k, n, scratch);
    ASSERT_TRUE(num.ok() && den.ok());
    const double ref = exl3_proxy_error(w.data(), wq.data(), k, n, identity ? std::vector<double>{} : h);
    EXPECT_NEAR(*num / *den, ref, 1e-12 * ref);
  }
  cudaFree(dh);
  cudaFree(dwd);
  cudaFree(ddd);
  cudaFree(scratch);
}

}  // namespace
}  // namespace spw::quant
#endif
