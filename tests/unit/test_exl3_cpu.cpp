// spw_cpu EXL3 x·W (cpu/exl3_gemm.h) against the fp64 reference exl3_matmul_ref, on every ISA this
// machine has (scalar, AVX2, AVX-512), at V4.1 expert shapes (5120×2304, 2304×5120), 4096×2048 and
// awkward ones, m = 1..64, every codebook, K 1..8 and half-integer. Output guard regions must stay
// untouched and no NaN may appear. Tolerance: 1e-4·RMS(y) per element (fp32 summation order only,
// k ≤ 5120 terms ⇒ ~1e-6 relative expected).
// Compiled only where spw_cpu is linked (SPW_HAVE_CPU comes from its interface).
#if defined(SPW_HAVE_CPU)
#include "cpu/exl3_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace spw {
namespace {

struct Owned {
  std::vector<uint16_t> trellis;
  Exl3Tensor t;
};

Owned random_tensor(int64_t k, int64_t n, int k_x2, Exl3Codebook cb, bool bias, uint32_t seed) {
  std::mt19937 rng(seed);
  Owned o;
  o.t.name = "random";
  o.t.k = k;
  o.t.n = n;
  o.t.bits.k_x2 = k_x2;
  o.t.codebook = cb;
  o.trellis.resize(static_cast<size_t>(k / 16) * (n / 16) * o.t.bits.words_per_tile());
  for (auto& w : o.trellis) w = rng() & 0xffff;
  o.t.trellis = o.trellis.data();
  std::normal_distribution<float> nd(0, 1);
  o.t.suh.resize(k);
  o.t.svh.resize(n);
  for (auto& v : o.t.suh) v = exl3_f64_to_f16(0.03 * nd(rng));
  for (auto& v : o.t.svh) v = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * (1 + 0.2 * nd(rng)));
  if (bias) {
    o.t.bias.resize(n);
    for (auto& v : o.t.bias) v = exl3_f64_to_f16(0.1 * nd(rng));
  }
  return o;
}

void check(const Exl3Tensor& t, int64_t m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(m * t.k);
  for (auto& v : x) v = nd(rng);
  std::vector<float> ref(m * t.n);
  exl3_matmul_ref(t, x.data(), m, ref.data());
  double rms = 0;
  for (float v : ref) rms += double(v) * v;
  rms = std::sqrt(rms / ref.size());
  const int64_t guard = 64;
  const float sentinel = 12345.678f;
  for (int isa = 0; isa <= static_cast<int>(cpu_isa_detect()); ++isa) {
    SCOPED_TRACE(cpu_isa_name(static_cast<CpuIsa>(isa)));
    std::vector<float> y(m * t.n + 2 * guard, sentinel);
    exl3_matmul_cpu_isa(static_cast<CpuIsa>(isa), t, x.data(), m, y.data() + guard);
    for (int64_t i = 0; i < guard; ++i) {
      ASSERT_EQ(y[i], sentinel);
      ASSERT_EQ(y[guard + m * t.n + i], sentinel);
    }
    double max_err = 0;
    for (int64_t i = 0; i < m * t.n; ++i) {
      ASSERT_FALSE(std::isnan(y[guard + i])) << i;
      max_err = std::max(max_err, std::fabs(double(y[guard + i]) - ref[i]));
    }
    EXPECT_LT(max_err, 1e-4 * rms) << "k=" << t.k << " n=" << t.n << " K2=" << t.bits.k_x2 << " cb="
                                    << exl3_codebook_name(t.codebook) << " m=" << m;
  }
}

TEST(Exl3Cpu, RealShapesK3) {
  struct Shape { int64_t k, n; int m; Exl3Codebook cb; };
  const Shape shapes[] = {{5120, 2304, 1, Exl3Codebook::kMul1}, {2304, 5120, 4, Exl3Codebook::kMcg},
                          {4096, 2048, 17, Exl3Codebook::k3Inst}, {5120, 2304, 8, Exl3Codebook::kMul1}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    Owned o = random_tensor(s.k, s.n, 6, s.cb, false, seed++);
    check(o.t, s.m, seed++);
  }
}

TEST(Exl3Cpu, EveryBitrateAndCodebook) {
  uint32_t seed = 100;
  for (int k_x2 = 2; k_x2 <= 16; k_x2 += 2)
    for (int cb = 0; cb < 3; ++cb) {
      Owned o = random_tensor(256, 128, k_x2, static_cast<Exl3Codebook>(cb), cb == 1, seed++);
      check(o.t, 1 + (seed % 3), seed);
    }
  for (int k_x2 : {3, 5, 7, 15}) {  // half-integer K, mul1 only
    Owned o = random_tensor(128, 256, k_x2, Exl3Codebook::kMul1, true, seed++);
    check(o.t, 2, seed);
  }
}

TEST(Exl3Cpu, AwkwardSizes) {
  uint32_t seed = 200;
  for (auto [k, n, m] : {std::tuple{128, 128, 1}, {384, 640, 7}, {1152, 128, 63}, {128, 1920, 33}}) {
    Owned o = random_tensor(k, n, 4 + (seed & 3), static_cast<Exl3Codebook>(seed % 3), true, seed);
    ++seed;
    check(o.t, m, seed++);
  }
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CPU
