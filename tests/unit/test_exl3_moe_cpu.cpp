// spw_cpu exl3_moe_cpu (cpu/exl3_moe.h) against a plain composition of references: per (token, slot),
// g = exl3_matmul_ref(W1), u = exl3_matmul_ref(W3), h = ref::swiglu(g, u, limit, weight),
// out += exl3_matmul_ref(W2, h). Cases: several tokens sharing experts, unused slots (-1), experts
// with no tokens, the clamp active (large activations), no clamp, accumulation into a non-zero out,
// every ISA and both decode modes, 1 and 3 threads, 1 and 4 parts per thread. Tolerance: 1e-4·RMS(out) (fp32 summation order in
// three products; the SwiGLU input differs by ~1e-6 relative, silu is smooth).
#if defined(SPW_HAVE_CPU)
#include "cpu/exl3_moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "exl3_random.h"
#include "ops/ref/moe.h"

namespace spw {
namespace {

using OwnedTensor = test::OwnedExl3;

void make_tensor(OwnedTensor& o, int64_t k, int64_t n, int k_x2, Exl3Codebook cb, std::mt19937& rng, float su_scale) {
  test::fill_random_exl3(o, k, n, k_x2, cb, rng, su_scale, false);
}

struct Layer {
  std::vector<OwnedTensor> w;  // 3 per expert: w1, w3, w2
  std::vector<Exl3ExpertWeights> experts;
};

void make_layer(Layer& L, int n_experts, int64_t d, int64_t f, float su_scale, uint32_t seed) {
  std::mt19937 rng(seed);
  L.w.resize(3 * n_experts);
  for (int e = 0; e < n_experts; ++e) {
    const Exl3Codebook cb = static_cast<Exl3Codebook>(e % 3);
    make_tensor(L.w[3 * e], d, f, 6, cb, rng, su_scale);
    make_tensor(L.w[3 * e + 1], d, f, 4 + 2 * (e % 2), cb, rng, su_scale);
    make_tensor(L.w[3 * e + 2], f, d, 6, Exl3Codebook::kMul1, rng, 0.03f);
  }
  L.experts.resize(n_experts);
  for (int e = 0; e < n_experts; ++e) L.experts[e] = {&L.w[3 * e].t, &L.w[3 * e + 1].t, &L.w[3 * e + 2].t};
}

void moe_reference(const Layer& L, const float* x, int64_t n_tokens, const int32_t* ids, const float* wts, int64_t top_k,
                   float limit, float* out) {
  for (int64_t j = 0; j < n_tokens; ++j)
    for (int64_t s = 0; s < top_k; ++s) {
      const int32_t e = ids[j * top_k + s];
      if (e < 0) continue;
      const Exl3ExpertWeights& ew = L.experts[e];
      const int64_t d = ew.w1->k, f = ew.w1->n;
      std::vector<float> g(f), u(f), h(f), y(d);
      exl3_matmul_ref(*ew.w1, x + j * d, 1, g.data());
      exl3_matmul_ref(*ew.w3, x + j * d, 1, u.data());
      ref::swiglu(g.data(), u.data(), h.data(), f, limit, wts[j * top_k + s]);
      exl3_matmul_ref(*ew.w2, h.data(), 1, y.data());
      for (int64_t c = 0; c < d; ++c) out[j * d + c] += y[c];
    }
}

void check_layer(const Layer& L, int64_t n_tokens, const std::vector<int32_t>& ids, int64_t top_k, float limit,
                 float x_scale, uint32_t seed) {
  const int64_t d = L.experts[0].w1->k;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(n_tokens * d), wts(n_tokens * top_k), base(n_tokens * d);
  for (auto& v : x) v = x_scale * nd(rng);
  for (auto& v : wts) v = 0.1f + 0.4f * std::fabs(nd(rng));
  for (auto& v : base) v = nd(rng);
  std::vector<float> ref = base;
  moe_reference(L, x.data(), n_tokens, ids.data(), wts.data(), top_k, limit, ref.data());
  double rms = 0;
  for (size_t i = 0; i < ref.size(); ++i) rms += double(ref[i] - base[i]) * (ref[i] - base[i]);
  rms = std::sqrt(rms / ref.size());
  ASSERT_GT(rms, 0);
  for (size_t threads : {1, 3})
    for (int parts_per_thread : {1, 4}) {  // 4: more, smaller parts (and their k-slice scratch) per job
      ThreadPool pool(threads);
      for (int run = 0; run <= 2 * static_cast<int>(cpu_isa_detect()); ++run) {
        Exl3CpuOptions opt;
        opt.isa = static_cast<CpuIsa>((run + 1) / 2);
        opt.decode = run > 0 && run % 2 == 0 ? Exl3Decode::kLut : Exl3Decode::kArith;
        opt.parts_per_thread = parts_per_thread;
        SCOPED_TRACE(std::string(cpu_isa_name(opt.isa)) + (opt.decode == Exl3Decode::kLut ? " lut" : " arith") +
                     " threads=" + std::to_string(threads) + " parts_per_thread=" + std::to_string(parts_per_thread));
        std::vector<float> out = base;
        exl3_moe_cpu(L.experts.data(), static_cast<int64_t>(L.experts.size()), x.data(), n_tokens, ids.data(), wts.data(),
                     top_k, limit, out.data(), &pool, opt);
        double max_err = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_FALSE(std::isnan(out[i])) << i;
          max_err = std::max(max_err, std::fabs(double(out[i]) - ref[i]));
        }
        EXPECT_LT(max_err, 1e-4 * rms) << "tokens=" << n_tokens << " limit=" << limit;
      }
    }
}

TEST(Exl3MoeCpu, TokensGroupedPerExpert) {
  Layer L;
  make_layer(L, 5, 256, 384, 0.03f, 1);
  // 4 tokens × top-3: expert 1 shared by three tokens, expert 4 never used, one empty slot.
  const std::vector<int32_t> ids = {1, 0, 2, 3, 1, -1, 1, 2, 0, 3, 2, 1};
  check_layer(L, 4, ids, 3, 10.0f, 1.0f, 2);
}

TEST(Exl3MoeCpu, ClampActiveAndNoClamp) {
  Layer L;
  make_layer(L, 3, 128, 256, 0.3f, 3);  // large suh: gate/up well beyond ±10
  const std::vector<int32_t> ids = {0, 2, 1, 0};
  check_layer(L, 2, ids, 2, 10.0f, 4.0f, 4);
  check_layer(L, 2, ids, 2, 0.0f, 4.0f, 5);
}

TEST(Exl3MoeCpu, SingleTokenSixExperts) {
  Layer L;
  make_layer(L, 8, 512, 256, 0.03f, 6);
  const std::vector<int32_t> ids = {7, 1, 3, 0, 5, 6};
  check_layer(L, 1, ids, 6, 10.0f, 1.0f, 7);
}

TEST(Exl3MoeCpu, NoActiveExpertsLeavesOutUntouched) {
  Layer L;
  make_layer(L, 2, 128, 128, 0.03f, 8);
  const std::vector<int32_t> ids = {-1, -1};
  std::vector<float> x(2 * 128, 1.0f), wts(2, 1.0f), out(2 * 128, 3.0f);
  exl3_moe_cpu(L.experts.data(), 2, x.data(), 2, ids.data(), wts.data(), 1, 10.0f, out.data());
  for (float v : out) ASSERT_EQ(v, 3.0f);
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CPU
