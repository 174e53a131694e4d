// engine/engram_kernels.h engram_gate_cuda against the CPU reference's gate (src/model/engram.cpp,
// restated here as the oracle: per token and residual copy, f64 sums left to right, the gate, the
// update, bf16 rounding) at V4.1 shapes (hc 4, d_model 5120; decode and prefill token counts) and
// awkward ones (hc 1 and 8, widths 7 and 300), with and without bf16 rounding.
// Tolerance: 1 bf16 ulp of the expected value (2^-7 relative) and ≥ 99 % bit-exact. The kernel sums
// in f64 in a tree where the reference sums left to right (each term exact or rounded once in f64,
// so the f32 norms and dot product agree except on rare f64 rounding ties), and σ's exp is the f64
// exp rounded once where glibc's expf may differ by an ulp: a one-ulp gate can move the rounded
// stream value by one bf16 ulp.
#if defined(SPW_HAVE_CUDA)
#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>

#include "engine/engram_kernels.h"
#include "formats/dtypes.h"
#include "ops/ref/linalg.h"
#include "test_cuda_ops_util.h"

namespace spw {
namespace {

using cuda_test::Guarded;
using cuda_test::normal;
using cuda_test::no_nan;
using cuda_test::within;

// model/engram.cpp's gate loop on streams [n, hc, d] with kv [n, (hc+1)·d] and qk [hc, d].
void reference_gate(std::vector<float>& streams, const std::vector<float>& kv, const std::vector<float>& qk, int n,
                    int hc, int d, float eps, bool round_out) {
  const float inv_sqrt_d = 1.0f / std::sqrt(float(d));
  for (int i = 0; i < n; ++i) {
    const float* key = kv.data() + size_t(i) * (hc + 1) * d;
    const float* value = key + size_t(hc) * d;
    for (int j = 0; j < hc; ++j) {
      float* xj = streams.data() + (size_t(i) * hc + j) * d;
      const float* kj = key + size_t(j) * d;
      double sx = 0, sk = 0, dot = 0;
      for (int ch = 0; ch < d; ++ch) {
        const float wgt = qk[size_t(j) * d + ch];
        sx += double(xj[ch]) * xj[ch];
        sk += double(kj[ch]) * kj[ch];
        dot += double(xj[ch]) * wgt * kj[ch];
      }
      const float rx = 1.0f / std::sqrt(float(sx / d) + eps);
      const float rk = 1.0f / std::sqrt(float(sk / d) + eps);
      const float g_dot = float(dot) * rx * rk * inv_sqrt_d;
      const float sign = float((g_dot > 0.f) - (g_dot < 0.f));
      const float gate = ref::sigmoid(sign * std::sqrt(std::max(std::fabs(g_dot), 1e-6f)));
      for (int ch = 0; ch < d; ++ch) {
        xj[ch] += gate * value[ch];
        if (round_out) xj[ch] = round_bf16(xj[ch]);
      }
    }
  }
}

void gate_case(int n, int hc, int d, bool round_out, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "engram_gate n=" << n << " hc=" << hc << " d=" << d << " round=" << round_out);
  std::vector<float> streams = normal(size_t(n) * hc * d, 0.f, 1.f, seed, true);
  // Keys correlated with the streams so the gates spread over (0, 1) rather than sitting at σ(0).
  std::vector<float> kv = normal(size_t(n) * (hc + 1) * d, 0.f, 1.f, seed + 1, true);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < hc; ++j)
      for (int ch = 0; ch < d; ++ch) {
        float& k = kv[(size_t(i) * (hc + 1) + j) * d + ch];
        k = round_bf16(k + float((i + j) % 3 - 1) * streams[(size_t(i) * hc + j) * d + ch]);
      }
  const std::vector<float> q = normal(size_t(hc) * d, 1.f, 0.3f, seed + 2, false);
  const std::vector<float> k = normal(size_t(hc) * d, 1.f, 0.3f, seed + 3, false);
  std::vector<float> qk(q.size());
  for (size_t i = 0; i < qk.size(); ++i) qk[i] = q[i] * k[i];
  const float eps = 1e-6f;

  std::vector<float> want = streams;
  reference_gate(want, kv, qk, n, hc, d, eps, round_out);
  Guarded<float> dstreams(streams), dkv(kv), dqk(qk);
  SPW_ASSERT_OK(engine::engram_gate_cuda(dstreams.get(), dkv.get(), dqk.get(), n, hc, d, eps, round_out, nullptr));
  const std::vector<float> got = dstreams.download();
  ASSERT_TRUE(no_nan(got));
  size_t n_exact = 0;
  EXPECT_TRUE(within(got, want, [&](size_t i) { return std::ldexp(std::fabs(double(want[i])), -7); }, &n_exact));
  EXPECT_GE(double(n_exact), 0.99 * double(got.size())) << n_exact << " of " << got.size() << " bit-exact";
  std::cout << "  [engram_gate n=" << n << " hc=" << hc << " d=" << d << "] " << n_exact << " of " << got.size()
            << " bit-exact\n";
  EXPECT_TRUE(dstreams.guards_intact());
  EXPECT_TRUE(dkv.guards_intact());
}

TEST(EngineEngramGate, RealShapes) {
  SPW_REQUIRE_GPU();
  gate_case(1, 4, 5120, true, 1);    // V4.1 decode
  gate_case(5, 4, 5120, true, 2);    // a small batch
  gate_case(64, 4, 5120, true, 3);   // a prefill chunk
  gate_case(3, 4, 5120, false, 4);   // without the bf16 rounding
}

TEST(EngineEngramGate, AwkwardShapes) {
  SPW_REQUIRE_GPU();
  gate_case(3, 1, 7, true, 11);
  gate_case(2, 8, 300, true, 12);
  gate_case(17, 2, 1023, false, 13);
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
