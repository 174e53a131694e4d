// spw_cuda_ops router and SwiGLU (cuda/ops/moe.h) against model/moe.cpp route()'s composition of
// ref::sqrtsoftplus, ref::topk_indices on score + bias, ref::route_weights, hash routing from tid2eid,
// and ref::swiglu. V4.1 shapes (384 experts, top 6, norm_eps 1e-20, d_expert 2304, clamp 10), V4's
// (256 experts, norm_eps 0), ties (few distinct logits, no bias), and awkward sizes.
// Tolerances: expert ids must match exactly (order included). Scores come from exp/log1p evaluated in
// f64 and rounded once, which equals glibc's expf/log1pf except in rare 1-ulp cases, so weights and
// SwiGLU outputs may differ by 4·FLT_EPSILON relative (1 bf16 ulp, 2^-7 relative, once rounded to bf16);
// most are bit-exact and the count is printed.
#if defined(SPW_HAVE_CUDA)
#include <cfloat>
#include <iostream>
#include <random>

#include "cuda/ops/moe.h"
#include "formats/dtypes.h"
#include "ops/ref/linalg.h"
#include "ops/ref/moe.h"
#include "ops/ref/topk.h"
#include "test_cuda_ops_util.h"

namespace spw {
namespace {

using cuda_test::bits_equal;
using cuda_test::Guarded;
using cuda_test::no_nan;
using cuda_test::within;

enum class Logits { kNormal, kTies };

void router_case(int64_t n_tokens, int n_experts, int top_k, float norm_eps, float route_scale, bool hash,
                 Logits kind, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << (hash ? "router_hash" : "router_topk") << " tokens=" << n_tokens
                                  << " experts=" << n_experts << " top_k=" << top_k << " norm_eps=" << norm_eps
                                  << " route_scale=" << route_scale << (kind == Logits::kTies ? " ties" : ""));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> logits(size_t(n_tokens * n_experts)), bias(n_experts);
  for (auto& v : logits) v = kind == Logits::kTies ? float(int(rng() % 3) - 1) : nd(rng);
  for (auto& v : bias) v = kind == Logits::kTies ? 0.f : 0.05f * nd(rng);
  const int64_t vocab = 1000;
  std::vector<int32_t> tokens(n_tokens), tid2eid(size_t(vocab * top_k));
  for (auto& t : tokens) t = int32_t(rng() % vocab);
  for (auto& e : tid2eid) e = int32_t(rng() % n_experts);

  // model/moe.cpp route(), without the gate linear.
  std::vector<int32_t> want_e(size_t(n_tokens * top_k));
  std::vector<float> want_w(want_e.size()), scores(logits.size()), biased(n_experts);
  ref::sqrtsoftplus(logits.data(), scores.data(), logits.size());
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* st = scores.data() + t * n_experts;
    int32_t* idx = want_e.data() + t * top_k;
    if (hash) {
      std::copy_n(tid2eid.data() + int64_t(tokens[t]) * top_k, top_k, idx);
    } else {
      for (int e = 0; e < n_experts; ++e) biased[e] = st[e] + bias[e];
      auto top = ref::topk_indices(biased.data(), n_experts, top_k);
      std::copy(top.begin(), top.end(), idx);
    }
    ref::route_weights(st, idx, top_k, norm_eps, route_scale, want_w.data() + t * top_k);
  }

  Guarded<float> dl(logits), db(bias), dw(want_w.size());
  Guarded<int32_t> dtok(tokens), dmap(tid2eid), de(want_e.size());
  if (hash)
    SPW_ASSERT_OK(cuda::router_hash(dl.get(), dtok.get(), dmap.get(), n_tokens, n_experts, top_k, norm_eps, route_scale,
                                    de.get(), dw.get(), nullptr));
  else
    SPW_ASSERT_OK(cuda::router_topk(dl.get(), db.get(), n_tokens, n_experts, top_k, norm_eps, route_scale, de.get(),
                                    dw.get(), nullptr));
  const std::vector<int32_t> got_e = de.download();
  const std::vector<float> got_w = dw.download();
  EXPECT_TRUE(bits_equal(got_e, want_e)) << "expert ids";
  EXPECT_TRUE(no_nan(got_w));
  size_t n_exact = 0;
  EXPECT_TRUE(within(got_w, want_w, [&](size_t i) { return 4.0 * FLT_EPSILON * std::fabs(want_w[i]); }, &n_exact));
  std::cout << "  [router] " << n_exact << " of " << got_w.size() << " weights bit-exact\n";
  EXPECT_TRUE(de.guards_intact());
  EXPECT_TRUE(dw.guards_intact());
}

TEST(CudaOpsRouter, TopkRealShapes) {
  SPW_REQUIRE_GPU();
  router_case(1, 384, 6, 1e-20f, 2.5f, false, Logits::kNormal, 1);
  router_case(64, 384, 6, 1e-20f, 2.5f, false, Logits::kNormal, 2);
  router_case(1023, 384, 6, 1e-20f, 2.5f, false, Logits::kNormal, 3);
  router_case(17, 256, 6, 0.f, 1.5f, false, Logits::kNormal, 4);  // V4
  router_case(127, 384, 6, 1e-20f, 2.5f, false, Logits::kTies, 5);
}

TEST(CudaOpsRouter, TopkAwkwardSizes) {
  SPW_REQUIRE_GPU();
  router_case(1, 1, 1, 0.f, 1.f, false, Logits::kNormal, 11);
  router_case(7, 7, 1, 1e-20f, 1.f, false, Logits::kNormal, 12);
  router_case(17, 17, 17, 1e-20f, 1.f, false, Logits::kNormal, 13);  // top_k = n_experts
  router_case(5, 1023, 7, 1e-20f, 1.f, false, Logits::kTies, 14);
  router_case(3, 4096, 64, 1e-20f, 1.f, false, Logits::kNormal, 15);
}

TEST(CudaOpsRouter, Hash) {
  SPW_REQUIRE_GPU();
  router_case(1, 384, 6, 1e-20f, 2.5f, true, Logits::kNormal, 21);
  router_case(127, 384, 6, 1e-20f, 2.5f, true, Logits::kNormal, 22);
  router_case(7, 17, 3, 0.f, 1.f, true, Logits::kNormal, 23);
}

TEST(CudaOpsRouter, RejectsBadShapes) {
  EXPECT_FALSE(cuda::router_topk(nullptr, nullptr, 1, 384, 6, 0.f, 1.f, nullptr, nullptr, nullptr).ok());  // no bias
  float dummy = 0;
  EXPECT_FALSE(cuda::router_topk(nullptr, &dummy, 1, 4, 5, 0.f, 1.f, nullptr, nullptr, nullptr).ok());     // k > E
  EXPECT_FALSE(cuda::router_topk(nullptr, &dummy, 1, 5000, 6, 0.f, 1.f, nullptr, nullptr, nullptr).ok());  // E too big
}

void swiglu_case(int64_t n_rows, int64_t n, bool fused, bool weighted, float limit, bool round_out, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "swiglu rows=" << n_rows << " n=" << n << " fused=" << fused << " weighted="
                                  << weighted << " limit=" << limit << " round_out=" << round_out);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 6.f);
  // fused: one [n_rows, 2n] buffer, gate | up; else separate [n_rows, n] buffers.
  std::vector<float> gu(size_t(n_rows * 2 * n)), rw(n_rows);
  for (auto& v : gu) v = round_bf16(nd(rng));
  for (auto& v : rw) v = std::fabs(nd(rng)) / 6.f;
  std::vector<float> g(size_t(n_rows * n)), u(size_t(n_rows * n)), want(size_t(n_rows * n));
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < n; ++i) g[r * n + i] = gu[r * 2 * n + i], u[r * n + i] = gu[r * 2 * n + n + i];
  for (int64_t r = 0; r < n_rows; ++r)
    ref::swiglu(g.data() + r * n, u.data() + r * n, want.data() + r * n, size_t(n), limit, weighted ? rw[r] : 1.0f);
  if (round_out) ref::round_bf16_inplace(want.data(), want.size());

  Guarded<float> dgu(gu), dg(g), du(u), drw(rw), dh(want.size());
  if (fused)
    SPW_ASSERT_OK(cuda::swiglu(dgu.get(), 2 * n, dgu.get() + n, 2 * n, weighted ? drw.get() : nullptr, n_rows, n, limit,
                               round_out, dh.get(), nullptr));
  else
    SPW_ASSERT_OK(cuda::swiglu(dg.get(), n, du.get(), n, weighted ? drw.get() : nullptr, n_rows, n, limit, round_out,
                               dh.get(), nullptr));
  const std::vector<float> got = dh.download();
  EXPECT_TRUE(no_nan(got));
  const double rel = round_out ? std::ldexp(1.0, -7) : 4.0 * FLT_EPSILON;
  size_t n_exact = 0;
  EXPECT_TRUE(within(got, want, [&](size_t i) { return rel * std::fabs(want[i]); }, &n_exact));
  std::cout << "  [swiglu] " << n_exact << " of " << got.size() << " bit-exact\n";
  EXPECT_TRUE(dh.guards_intact());
}

TEST(CudaOpsRouter, Swiglu) {
  SPW_REQUIRE_GPU();
  swiglu_case(1, 2304, true, true, 10.f, true, 1);     // routed expert, decode, V4.1 clamp
  swiglu_case(64, 2304, false, false, 10.f, true, 2);  // shared expert (weight 1)
  swiglu_case(17, 2048, true, true, 0.f, true, 3);     // V4 routed expert: no clamp
  swiglu_case(7, 1, false, true, 10.f, false, 4);
  swiglu_case(127, 17, true, false, 0.f, false, 5);
  swiglu_case(1023, 7, false, true, 3.f, false, 6);
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
