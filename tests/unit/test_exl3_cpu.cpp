// spw_cpu EXL3 x·W (cpu/exl3_gemm.h) against the fp64 reference exl3_matmul_ref, on every ISA this
// machine has (scalar, AVX2, AVX-512, AVX-512 VBMI, AVX-512 FP16), at V4.1 expert shapes (5120×2304, 2304×5120), 4096×2048 and
// awkward ones, m = 1..64, every codebook, K 1..8 and half-integer, both decode modes (arithmetic and
// table) and forced k-splits. Output guard regions must stay untouched and no NaN may appear. Tolerance:
// 2e-5·RMS(y) per element: fp32 summation order only (k ≤ 5120 terms; measured at most 6.4e-6 on these
// cases, by the scalar kernel), with room to spare, yet tight enough to fail an AMX path that drops its
// third bf16 plane of x (measured 4.6e-5 to 5.9e-5), which 1e-4 let pass.
// Decode exactness is checked separately and bit for bit: the tile kernels with one-hot activations must
// reproduce exl3_decode_inner for every ISA, decode mode, codebook and K (and, where the machine has AMX,
// with the tile unit on and off at m = 16).
// Compiled only where spw_cpu is linked (SPW_HAVE_CPU comes from its interface).
#if defined(SPW_HAVE_CPU)
#include "cpu/exl3_gemm.h"
#include "exl3_random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace spw {
namespace {

using Owned = test::OwnedExl3;

Owned random_tensor(int64_t k, int64_t n, int k_x2, Exl3Codebook cb, bool bias, uint32_t seed) {
  std::mt19937 rng(seed);
  Owned o;
  test::fill_random_exl3(o, k, n, k_x2, cb, rng, 0.03f, bias);
  return o;
}

void check(const Exl3Tensor& t, int64_t m, uint32_t seed, int k_splits = 0) {
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
  // Runs: scalar, then each SIMD ISA with both decodes; where AMX is ready, the top ISA once more with AMX
  // off, so m ≥ kAmxMinTokens checks both the tile unit and the FMA path.
  const int last_run = 2 * static_cast<int>(cpu_isa_detect()) + (detail::amx_ready() ? 1 : 0);
  for (int run = 0; run <= last_run; ++run) {
    const bool no_amx = run > 2 * static_cast<int>(cpu_isa_detect());
    Exl3CpuOptions opt;
    opt.isa = no_amx ? cpu_isa_detect() : static_cast<CpuIsa>((run + 1) / 2);
    opt.decode = run > 0 && run % 2 == 0 && !no_amx ? Exl3Decode::kLut : Exl3Decode::kArith;
    opt.k_splits = k_splits;
    opt.amx = !no_amx;
    SCOPED_TRACE(std::string(cpu_isa_name(opt.isa)) + (opt.decode == Exl3Decode::kLut ? " lut" : " arith") +
                 (no_amx ? " amx off" : "") + " k_splits=" + std::to_string(k_splits));
    std::vector<float> y(m * t.n + 2 * guard, sentinel);
    exl3_matmul_cpu_opts(opt, t, x.data(), m, y.data() + guard);
    for (int64_t i = 0; i < guard; ++i) {
      ASSERT_EQ(y[i], sentinel);
      ASSERT_EQ(y[guard + m * t.n + i], sentinel);
    }
    double max_err = 0;
    for (int64_t i = 0; i < m * t.n; ++i) {
      ASSERT_FALSE(std::isnan(y[guard + i])) << i;
      max_err = std::max(max_err, std::fabs(double(y[guard + i]) - ref[i]));
    }
    EXPECT_LT(max_err, 2e-5 * rms) << "k=" << t.k << " n=" << t.n << " K2=" << t.bits.k_x2 << " cb="
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

TEST(Exl3Cpu, KSplits) {
  // Forced k-slices (uneven ones too), summed in stage 3; also the default split on a 4-thread pool.
  uint32_t seed = 300;
  for (int ks : {2, 3, 7}) {
    Owned o = random_tensor(1152, 256, 6, static_cast<Exl3Codebook>(ks % 3), ks == 3, seed++);
    check(o.t, ks == 7 ? 33 : 1 + ks, seed++, ks);
  }
  ThreadPool pool(4);
  Owned o = random_tensor(2048, 128, 6, Exl3Codebook::kMul1, false, seed++);
  int64_t k_splits = 0, n_splits = 0;  // 8 column tiles: 2 × 4 beats 4 narrow columns and ties with 4 slices
  detail::exl3_split(2048 / 16, 128 / 16, 4, &k_splits, &n_splits);
  EXPECT_EQ(k_splits, 2);
  EXPECT_EQ(n_splits, 2);
  std::vector<float> x(3 * 2048), ref(3 * 128), y(3 * 128);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  for (auto& v : x) v = nd(rng);
  exl3_matmul_ref(o.t, x.data(), 3, ref.data());
  exl3_matmul_cpu(o.t, x.data(), 3, y.data(), &pool);
  double rms = 0, max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) rms += double(ref[i]) * ref[i];
  rms = std::sqrt(rms / ref.size());
  for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::fabs(double(y[i]) - ref[i]));
  EXPECT_LT(max_err, 2e-5 * rms);
}

// Exl3CpuOptions::parts_per_thread: 4 parts per thread of a 3-thread pool (12 parts: k-slices and column ranges
// the default split never makes) must give the reference's product within the same bound.
TEST(Exl3Cpu, MorePartsPerThread) {
  ThreadPool pool(3);
  uint32_t seed = 350;
  for (auto [k, n, m] : {std::tuple{5120, 2304, 1}, {2304, 5120, 3}, {1152, 256, 7}, {384, 640, 16}}) {
    Owned o = random_tensor(k, n, 6, static_cast<Exl3Codebook>(seed % 3), (seed & 1) != 0, seed);
    ++seed;
    std::vector<float> x(m * k), ref(m * n), y(m * n);
    std::mt19937 rng(seed++);
    std::normal_distribution<float> nd(0, 1);
    for (auto& v : x) v = nd(rng);
    exl3_matmul_ref(o.t, x.data(), m, ref.data());
    Exl3CpuOptions opt;
    opt.parts_per_thread = 4;
    exl3_matmul_cpu_opts(opt, o.t, x.data(), m, y.data(), &pool);
    double rms = 0, max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) rms += double(ref[i]) * ref[i];
    rms = std::sqrt(rms / ref.size());
    for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::fabs(double(y[i]) - ref[i]));
    EXPECT_LT(max_err, 2e-5 * rms) << "k=" << k << " n=" << n << " m=" << m;
  }
}

TEST(Exl3Cpu, DecodeBitExact) {
  // Part = one tile row; m tokens one-hot on rows r0 .. r0 + m − 1 of the tile: u[i][col] is Ŵ[16·tk + r0 + i][col]
  // exactly (every other product is 0). m = 1, 2, 3 run the kernels' per-group paths, m = 16 the blocked one.
  uint32_t seed = 400;
  for (int k_x2 = 2; k_x2 <= 16; ++k_x2)
    for (int cb = 0; cb < 3; ++cb) {
      if ((k_x2 & 1) && cb != 2) continue;
      const int64_t k = 256, n = 256, n_tk = k / 16;
      Owned o = random_tensor(k, n, k_x2, static_cast<Exl3Codebook>(cb), false, seed++);
      const std::vector<uint16_t> w = exl3_decode_inner(o.t);
      for (int m : {1, 2, 3, 16}) {
        for (int isa = 0; isa <= static_cast<int>(cpu_isa_detect()); ++isa)
          for (int variant = 0; variant < 3; ++variant) {  // arith, table, arith without AMX
            const Exl3Decode dec = variant == 1 ? Exl3Decode::kLut : Exl3Decode::kArith;
            const bool amx = variant != 2;
            if (!amx && !(isa == static_cast<int>(CpuIsa::kAvx512Fp16) && m >= detail::kAmxMinTokens && detail::amx_ready()))
              continue;
            int64_t bad = 0;
            for (int r0 = 0; r0 < 16; r0 += m) {
              std::vector<float> xe(m * n_tk * 32, 0.0f);
              for (int i = 0; i < m; ++i)
                for (int64_t tk = 0; tk < n_tk; ++tk)
                  for (int p = 0; p < 32; ++p) xe[(tk * m + i) * 32 + p] = exl3_perm_row(p) == r0 + i ? 1.0f : 0.0f;
              std::vector<float> u(m * n);
              for (int64_t tk = 0; tk < n_tk; ++tk) {
                detail::Exl3Part part{&o.t, xe.data(), m, tk, tk + 1, 0, n / 16, u.data(), n};
                part.amx = amx;
                detail::exl3_tile_fn(static_cast<CpuIsa>(isa))(part, dec);
                for (int i = 0; i < m && r0 + i < 16; ++i)
                  for (int64_t c = 0; c < n; ++c)
                    if (u[i * n + c] != exl3_f16_to_f32(w[(tk * 16 + r0 + i) * n + c])) ++bad;
              }
            }
            EXPECT_EQ(bad, 0) << cpu_isa_name(static_cast<CpuIsa>(isa)) << (dec == Exl3Decode::kLut ? " lut" : " arith")
                              << " k_x2=" << k_x2 << " cb=" << exl3_codebook_name(static_cast<Exl3Codebook>(cb))
                              << " m=" << m << (amx ? "" : " amx off");
          }
      }
    }
}

// The VBMI kernels' pieces against the definitions in formats/exl3: the 16-bit-lane codebooks (FP16
// arithmetic, and fp32 with one rounding) for every one of the 65,536 states of each codebook, and the
// vpermb/vpermt2b + vpmultishiftqb state extraction for every bit width (integer and half-integer K) on
// random tiles. Each needs its ISA: skipped, with the reason printed, on machines without it (the AVX2 /
// AVX-512 cases above still run).
void expect_codebook_matches(void (*fn)(Exl3Codebook, const uint16_t*, int64_t, uint16_t*), const char* name) {
  std::vector<uint16_t> states(65536), got(65536);
  for (uint32_t s = 0; s < 65536; ++s) states[s] = static_cast<uint16_t>(s);
  for (int cb = 0; cb < 3; ++cb) {
    const auto c = static_cast<Exl3Codebook>(cb);
    std::fill(got.begin(), got.end(), 0);
    fn(c, states.data(), 65536, got.data());
    int64_t bad = 0, first = -1;
    for (uint32_t s = 0; s < 65536; ++s)
      if (got[s] != exl3_codebook_f16(c, static_cast<uint16_t>(s)) && bad++ == 0) first = s;
    EXPECT_EQ(bad, 0) << name << " " << exl3_codebook_name(c) << ": first wrong state " << first;
  }
  // A count that is not a multiple of 32 must not write past its end.
  std::vector<uint16_t> out(40, 0xBEEF);
  fn(Exl3Codebook::kMul1, states.data(), 37, out.data());
  for (int i = 0; i < 37; ++i) EXPECT_EQ(out[i], exl3_codebook_f16(Exl3Codebook::kMul1, static_cast<uint16_t>(i))) << name;
  for (int i = 37; i < 40; ++i) EXPECT_EQ(out[i], 0xBEEF) << name;
}

TEST(Exl3Cpu, Avx512Fp16CodebookEqualsTheDefinitionForEveryState) {
  if (cpu_isa_detect() < CpuIsa::kAvx512Fp16) GTEST_SKIP() << "no AVX-512 FP16 + VBMI on this machine";
  expect_codebook_matches(detail::exl3_codebook_avx512fp16, "avx512fp16");
}

TEST(Exl3Cpu, Avx512VbmiCodebookEqualsTheDefinitionForEveryState) {
  if (cpu_isa_detect() < CpuIsa::kAvx512Vbmi) GTEST_SKIP() << "no AVX-512 VBMI on this machine";
  expect_codebook_matches(detail::exl3_codebook_avx512vbmi, "avx512vbmi");
}

TEST(Exl3Cpu, Avx512VbmiStatesEqualTheDefinitionForEveryBitWidth) {
  if (cpu_isa_detect() < CpuIsa::kAvx512Vbmi) GTEST_SKIP() << "no AVX-512 VBMI on this machine";
  std::mt19937 rng(17);
  for (int k_x2 = 2; k_x2 <= 16; ++k_x2) {
    const Exl3Bits bits{k_x2};
    int64_t bad = 0;
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<uint16_t> tile(bits.words_per_tile());
      for (auto& v : tile) v = rng() & 0xffff;
      uint16_t want[256], got[256];
      exl3_tile_states(tile.data(), bits, want);
      detail::exl3_tile_states_avx512vbmi(tile.data(), bits, got);
      for (int p = 0; p < 256; ++p) bad += want[p] != got[p];
    }
    EXPECT_EQ(bad, 0) << "k_x2=" << k_x2;
  }
}

TEST(Exl3Cpu, Had128Avx2MatchesScalar) {
  if (cpu_isa_detect() < CpuIsa::kAvx2) GTEST_SKIP() << "no AVX2 on this machine";
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1);
  for (int rep = 0; rep < 20; ++rep) {
    float a[128], b[128];
    for (int i = 0; i < 128; ++i) a[i] = b[i] = nd(rng) * std::ldexp(1.0f, rep - 10);
    detail::had128_f32_scalar(a);
    detail::had128_f32_avx2(b);
    for (int i = 0; i < 128; ++i) ASSERT_EQ(a[i], b[i]) << i;
  }
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CPU
