// spw_cuda_ops mHC (cuda/ops/hyper_connection.h) against ops/ref/hyper_connection per token (and
// hc_head_pre against model.cpp's inline V4 head formula), at V4.1 shapes (hc 4, d_model 5120:
// hc_d 20480, 24 mixes; the V4 head's 4 mixes; 20 Sinkhorn iterations) and awkward ones (hc 1, 2, 3,
// 7, 8; widths 1, 7, 17, 1023; 1..1023 tokens).
// Tolerances:
//   hc_collapse, hc_expand (with and without bf16 rounding): bit-exact, same f32 operation order.
//   hc_split_sinkhorn, hc_head_pre: 2e-6 relative (≈16 ulp): the reference's loops per token; only
//     sigmoid/softmax exp may differ from glibc's expf by an ulp, and Sinkhorn's normalisations carry
//     such a perturbation along without growing it.
//   hc_mixes: 4e-6 · rsqrt(·) · Σ_i |fn[o,i]·X[i]|: the reference sums the 20480 products
//     sequentially in f32 and the GPU in a tree, so they differ by the rounding error of those sums
//     (~6e-8 · Σ|terms| for the sequential one); the bound is ~60× that.
#if defined(SPW_HAVE_CUDA)
#include <iostream>
#include <random>
#include <tuple>

#include "cuda/ops/hyper_connection.h"
#include "cuda/ops/norm.h"
#include "formats/dtypes.h"
#include "ops/ref/hyper_connection.h"
#include "ops/ref/linalg.h"
#include "test_cuda_ops_util.h"

namespace spw {
namespace {

using cuda_test::bits_equal;
using cuda_test::Guarded;
using cuda_test::normal;
using cuda_test::no_nan;
using cuda_test::within;

void mixes_case(int64_t n_tokens, int n_out, int64_t hc_d, float eps, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "hc_mixes tokens=" << n_tokens << " n_out=" << n_out << " hc_d=" << hc_d << " eps=" << eps);
  const std::vector<float> x = normal(size_t(n_tokens * hc_d), 0.f, 1.5f, seed, true);
  const std::vector<float> fn = normal(size_t(n_out * hc_d), 0.f, 0.02f, seed + 1);
  std::vector<float> want(size_t(n_tokens * n_out));
  std::vector<double> bound(want.size());
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x.data() + t * hc_d;
    ref::hc_mixes(xt, fn.data(), size_t(n_out), size_t(hc_d), eps, want.data() + t * n_out);
    double ss = 0;
    for (int64_t i = 0; i < hc_d; ++i) ss += double(xt[i]) * xt[i];
    const double inv = 1.0 / std::sqrt(ss / double(hc_d) + eps);
    for (int o = 0; o < n_out; ++o) {
      double abs_sum = 0;
      for (int64_t i = 0; i < hc_d; ++i) abs_sum += std::fabs(double(fn[o * hc_d + i]) * xt[i]);
      bound[t * n_out + o] = 4e-6 * inv * abs_sum;
    }
  }
  Guarded<float> dx(x), dfn(fn), dm(want.size());
  SPW_ASSERT_OK(cuda::hc_mixes(dx.get(), dfn.get(), n_tokens, n_out, hc_d, eps, dm.get(), nullptr));
  const std::vector<float> got = dm.download();
  ASSERT_TRUE(no_nan(got));
  EXPECT_TRUE(within(got, want, [&](size_t i) { return bound[i]; }));
  EXPECT_TRUE(dm.guards_intact());
}

TEST(CudaOpsHc, MixesRealShapes) {
  SPW_REQUIRE_GPU();
  mixes_case(1, 24, 4 * 5120, 1e-20f, 1);
  mixes_case(64, 24, 4 * 5120, 1e-6f, 2);
  mixes_case(7, 4, 4 * 5120, 1e-6f, 3);  // V4 head
  mixes_case(3, 24, 4 * 4096, 1e-6f, 4);  // V4-Flash d_model 4096
}

TEST(CudaOpsHc, MixesAwkwardSizes) {
  SPW_REQUIRE_GPU();
  mixes_case(1, 1, 1, 1e-6f, 11);
  mixes_case(7, 7, 7, 1e-6f, 12);
  mixes_case(17, 9, 17, 1e-6f, 13);
  mixes_case(127, 24, 1023, 1e-6f, 14);
  mixes_case(1023, 3, 300, 1e-6f, 15);
}

// A token's mixes must not depend on how many tokens share the call (decode steps and prefill chunks
// take different kernels: hc_mixes_kernel per token, hc_mixes_rows_kernel for long chunks): bit-identical
// to the same token computed alone.
TEST(CudaOpsHc, MixesIndependentOfTokenCount) {
  SPW_REQUIRE_GPU();
  for (int64_t hc_d : {int64_t(4 * 5120), int64_t(4 * 4096), int64_t(1000)}) {
    SCOPED_TRACE(testing::Message() << "hc_d=" << hc_d);
    const int64_t n_tokens = 37;  // 2 full blocks of 16 rows (4 batches of 4) and a partial one
    const int n_out = 24;
    const std::vector<float> x = normal(size_t(n_tokens * hc_d), 0.f, 1.5f, 41, true);
    const std::vector<float> fn = normal(size_t(n_out * hc_d), 0.f, 0.02f, 42);
    Guarded<float> dx(x), dfn(fn), all{size_t(n_tokens * n_out)}, one{size_t(n_out)};
    SPW_ASSERT_OK(cuda::hc_mixes(dx.get(), dfn.get(), n_tokens, n_out, hc_d, 1e-6f, all.get(), nullptr));
    const std::vector<float> got = all.download();
    for (int64_t t = 0; t < n_tokens; ++t) {
      SPW_ASSERT_OK(cuda::hc_mixes(dx.get() + t * hc_d, dfn.get(), 1, n_out, hc_d, 1e-6f, one.get(), nullptr));
      const std::vector<float> alone = one.download();
      ASSERT_TRUE(bits_equal(std::vector<float>(got.begin() + t * n_out, got.begin() + (t + 1) * n_out), alone))
          << "token " << t;
    }
    EXPECT_TRUE(all.guards_intact());
  }
}

void split_case(int64_t n_tokens, int hc, int iters, float hc_eps, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "hc_split_sinkhorn tokens=" << n_tokens << " hc=" << hc << " iters=" << iters);
  const int n_mix = (2 + hc) * hc;
  const std::vector<float> mixes = normal(size_t(n_tokens * n_mix), 0.f, 2.f, seed);
  const std::vector<float> scale = normal(3, 1.f, 0.5f, seed + 1);
  const std::vector<float> base = normal(size_t(n_mix), 0.f, 1.f, seed + 2);
  std::vector<float> want_pre, want_post, want_comb;
  for (int64_t t = 0; t < n_tokens; ++t) {
    auto c = ref::hc_split_sinkhorn(mixes.data() + t * n_mix, scale.data(), base.data(), hc, iters, hc_eps);
    want_pre.insert(want_pre.end(), c.pre.begin(), c.pre.end());
    want_post.insert(want_post.end(), c.post.begin(), c.post.end());
    want_comb.insert(want_comb.end(), c.comb.begin(), c.comb.end());
  }
  Guarded<float> dm(mixes), ds(scale), db(base), dpre(want_pre.size()), dpost(want_post.size()), dcomb(want_comb.size());
  SPW_ASSERT_OK(cuda::hc_split_sinkhorn(dm.get(), ds.get(), db.get(), n_tokens, hc, iters, hc_eps, dpre.get(),
                                        dpost.get(), dcomb.get(), nullptr));
  auto rel = [](const std::vector<float>& want) {
    return [&want](size_t i) { return 2e-6 * std::fabs(want[i]); };
  };
  for (auto [name, buf, want] : {std::tuple{"pre", &dpre, &want_pre}, std::tuple{"post", &dpost, &want_post},
                                 std::tuple{"comb", &dcomb, &want_comb}}) {
    const std::vector<float> got = buf->download();
    EXPECT_TRUE(no_nan(got)) << name;
    size_t n_exact = 0;
    EXPECT_TRUE(within(got, *want, rel(*want), &n_exact)) << name;
    std::cout << "  [hc_split " << name << "] " << n_exact << " of " << got.size() << " bit-exact\n";
    EXPECT_TRUE(buf->guards_intact()) << name;
  }
}

TEST(CudaOpsHc, SplitSinkhorn) {
  SPW_REQUIRE_GPU();
  split_case(1, 4, 20, 1e-6f, 1);
  split_case(64, 4, 20, 1e-6f, 2);
  split_case(1023, 4, 20, 1e-6f, 3);
  split_case(7, 1, 20, 1e-6f, 4);
  split_case(17, 2, 1, 1e-6f, 5);
  split_case(127, 3, 7, 1e-6f, 6);
  split_case(5, 8, 20, 1e-6f, 7);
}

// model.cpp's V4 head: pre_j = sigmoid(mixes_j·scale[0] + base_j) + hc_eps.
void head_pre_case(int64_t n_tokens, int hc, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "hc_head_pre tokens=" << n_tokens << " hc=" << hc);
  const std::vector<float> mixes = normal(size_t(n_tokens * hc), 0.f, 2.f, seed);
  const std::vector<float> scale = normal(1, 1.f, 0.5f, seed + 1), base = normal(size_t(hc), 0.f, 1.f, seed + 2);
  const float hc_eps = 1e-6f;
  std::vector<float> want(mixes.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = ref::sigmoid(mixes[i] * scale[0] + base[i % hc]) + hc_eps;
  Guarded<float> dm(mixes), ds(scale), db(base), dpre(want.size());
  SPW_ASSERT_OK(cuda::hc_head_pre(dm.get(), ds.get(), db.get(), n_tokens, hc, hc_eps, dpre.get(), nullptr));
  const std::vector<float> got = dpre.download();
  EXPECT_TRUE(no_nan(got));
  EXPECT_TRUE(within(got, want, [&](size_t i) { return 2e-6 * std::fabs(want[i]); }));
  EXPECT_TRUE(dpre.guards_intact());
}

TEST(CudaOpsHc, HeadPre) {
  SPW_REQUIRE_GPU();
  head_pre_case(1, 4, 1);
  head_pre_case(64, 4, 2);
  head_pre_case(1023, 1, 3);
  head_pre_case(17, 7, 4);
}

void collapse_expand_case(int64_t n_tokens, int hc, int64_t d, bool round_out, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "collapse/expand tokens=" << n_tokens << " hc=" << hc << " d=" << d
                                  << " round_out=" << round_out);
  const std::vector<float> x = normal(size_t(n_tokens * hc * d), 0.f, 3.f, seed, true);
  const std::vector<float> pre = normal(size_t(n_tokens * hc), 0.5f, 0.2f, seed + 1);
  const std::vector<float> post = normal(size_t(n_tokens * hc), 1.f, 0.4f, seed + 2);
  const std::vector<float> comb = normal(size_t(n_tokens * hc * hc), 0.25f, 0.1f, seed + 3);
  const std::vector<float> y = normal(size_t(n_tokens * d), 0.f, 1.f, seed + 4, true);

  std::vector<float> want_y(size_t(n_tokens * d)), want_x = x;
  for (int64_t t = 0; t < n_tokens; ++t) {
    ref::hc_collapse(x.data() + t * hc * d, pre.data() + t * hc, hc, size_t(d), want_y.data() + t * d);
    ref::hc_expand(want_x.data() + t * hc * d, y.data() + t * d, post.data() + t * hc, comb.data() + t * hc * hc, hc,
                   size_t(d));
  }
  if (round_out) {
    ref::round_bf16_inplace(want_y.data(), want_y.size());
    ref::round_bf16_inplace(want_x.data(), want_x.size());
  }
  Guarded<float> dx(x), dpre(pre), dpost(post), dcomb(comb), dy(y), dout(want_y.size());
  SPW_ASSERT_OK(cuda::hc_collapse(dx.get(), dpre.get(), n_tokens, hc, d, round_out, dout.get(), nullptr));
  SPW_ASSERT_OK(cuda::hc_expand(dx.get(), dy.get(), dpost.get(), dcomb.get(), n_tokens, hc, d, round_out, nullptr));
  const std::vector<float> got_y = dout.download(), got_x = dx.download();
  EXPECT_TRUE(no_nan(got_y));
  EXPECT_TRUE(no_nan(got_x));
  EXPECT_TRUE(bits_equal(got_y, want_y)) << "hc_collapse";
  EXPECT_TRUE(bits_equal(got_x, want_x)) << "hc_expand";
  EXPECT_TRUE(dout.guards_intact());
  EXPECT_TRUE(dx.guards_intact());
}

TEST(CudaOpsHc, CollapseExpandBitExact) {
  SPW_REQUIRE_GPU();
  collapse_expand_case(1, 4, 5120, true, 1);
  collapse_expand_case(64, 4, 5120, true, 2);
  collapse_expand_case(7, 4, 4096, false, 3);
  collapse_expand_case(1, 1, 1, false, 4);
  collapse_expand_case(17, 3, 7, true, 5);
  collapse_expand_case(127, 8, 17, false, 6);
  collapse_expand_case(1023, 2, 1023, true, 7);
}

// The fused decode kernels (hc_fused.cu) against the launches they replace, bit for bit: hc_collapse_norm =
// hc_collapse + rms_norm, with pre given (V4.1's carried pre), from a sublayer's mixes (hc_split_sinkhorn's pre)
// or from the V4 head's mixes (hc_head_pre); hc_expand_sinkhorn = hc_split_sinkhorn + hc_expand, and the pre it
// stores is hc_split_sinkhorn's.
void fused_case(int64_t n_tokens, int hc, int64_t d, bool round_out, int pre_source, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "fused mHC tokens=" << n_tokens << " hc=" << hc << " d=" << d
                                  << " round_out=" << round_out << " pre " << pre_source);
  const bool head = pre_source == 2;  // 0: given, 1: the sublayer's mixes, 2: the V4 head's mixes
  const int n_mix = head ? hc : (2 + hc) * hc, iters = 20;
  const float eps = 1e-6f, hc_eps = 1e-6f;
  const std::vector<float> x = normal(size_t(n_tokens * hc * d), 0.f, 3.f, seed, true);
  const std::vector<float> mixes = normal(size_t(n_tokens * n_mix), 0.f, 2.f, seed + 1);
  const std::vector<float> scale = normal(3, 1.f, 0.5f, seed + 2), base = normal(size_t(n_mix), 0.f, 1.f, seed + 3);
  const std::vector<float> given = normal(size_t(n_tokens * hc), 0.5f, 0.2f, seed + 4);
  const std::vector<float> w = normal(size_t(d), 1.f, 0.1f, seed + 5), y = normal(size_t(n_tokens * d), 0.f, 1.f, seed + 6, true);
  Guarded<float> dx(x), dm(mixes), ds(scale), db(base), dgiven(given), dw(w), dy(y);
  Guarded<float> pre(size_t(n_tokens * hc)), post(size_t(n_tokens * hc)), comb(size_t(n_tokens * hc * hc));
  Guarded<float> sep_out(size_t(n_tokens * d)), fused_out(size_t(n_tokens * d)), pre_out(size_t(n_tokens * hc));
  Guarded<float> sep_x(x), fused_x(x);

  const float* collapse_pre = dgiven.get();
  if (pre_source == 1) {
    SPW_ASSERT_OK(cuda::hc_split_sinkhorn(dm.get(), ds.get(), db.get(), n_tokens, hc, iters, hc_eps, pre.get(),
                                          post.get(), comb.get(), nullptr));
    collapse_pre = pre.get();
  } else if (head) {
    SPW_ASSERT_OK(cuda::hc_head_pre(dm.get(), ds.get(), db.get(), n_tokens, hc, hc_eps, pre.get(), nullptr));
    collapse_pre = pre.get();
  }
  SPW_ASSERT_OK(cuda::hc_collapse(dx.get(), collapse_pre, n_tokens, hc, d, round_out, sep_out.get(), nullptr));
  SPW_ASSERT_OK(cuda::rms_norm(sep_out.get(), dw.get(), sep_out.get(), n_tokens, d, eps, round_out, nullptr));
  const cuda::HcPreFromMixes from{dm.get(), n_mix, ds.get(), db.get(), hc_eps};
  SPW_ASSERT_OK(cuda::hc_collapse_norm(dx.get(), pre_source == 0 ? dgiven.get() : nullptr,
                                       pre_source == 0 ? nullptr : &from, dw.get(), n_tokens, hc, d, eps, round_out,
                                       fused_out.get(), nullptr));
  EXPECT_TRUE(bits_equal(fused_out.download(), sep_out.download())) << "hc_collapse_norm";
  EXPECT_TRUE(fused_out.guards_intact());
  if (head) return;  // the head has no expansion

  if (pre_source != 1)
    SPW_ASSERT_OK(cuda::hc_split_sinkhorn(dm.get(), ds.get(), db.get(), n_tokens, hc, iters, hc_eps, pre.get(),
                                          post.get(), comb.get(), nullptr));
  SPW_ASSERT_OK(cuda::hc_expand(sep_x.get(), dy.get(), post.get(), comb.get(), n_tokens, hc, d, round_out, nullptr));
  SPW_ASSERT_OK(cuda::hc_expand_sinkhorn(fused_x.get(), dy.get(), from, iters, n_tokens, hc, d, round_out,
                                         pre_out.get(), nullptr));
  EXPECT_TRUE(bits_equal(fused_x.download(), sep_x.download())) << "hc_expand_sinkhorn";
  EXPECT_TRUE(bits_equal(pre_out.download(), pre.download())) << "hc_expand_sinkhorn's pre";
  EXPECT_TRUE(fused_x.guards_intact());
  EXPECT_TRUE(pre_out.guards_intact());
}

TEST(CudaOpsHc, FusedDecodeKernelsMatchSeparateLaunches) {
  SPW_REQUIRE_GPU();
  fused_case(1, 4, 5120, true, 0, 31);    // V4.1 decode: carried pre
  fused_case(16, 4, 5120, true, 1, 32);   // V4 batch 16: the sublayer's pre
  fused_case(3, 4, 4096, true, 2, 33);    // V4 head
  fused_case(2, 4, 4096, false, 1, 34);   // f32 activations
  fused_case(5, 2, 1000, true, 1, 35);    // hc 2, a width that is no multiple of the blocks
  fused_case(1, 4, 3, true, 0, 36);       // narrower than a warp
}

TEST(CudaOpsHc, RejectsBadShapes) {
  EXPECT_FALSE(cuda::hc_split_sinkhorn(nullptr, nullptr, nullptr, 1, 9, 20, 1e-6f, nullptr, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(cuda::hc_split_sinkhorn(nullptr, nullptr, nullptr, 1, 4, 0, 1e-6f, nullptr, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(cuda::hc_collapse(nullptr, nullptr, 1, 0, 8, false, nullptr, nullptr).ok());
  const float pre = 0.f;
  const cuda::HcPreFromMixes from{};
  EXPECT_FALSE(cuda::hc_collapse_norm(nullptr, &pre, nullptr, nullptr, 1, 3, 8, 1e-6f, false, nullptr, nullptr).ok())
      << "hc 3 is not fused";
  EXPECT_FALSE(cuda::hc_collapse_norm(nullptr, &pre, &from, nullptr, 1, 4, 8, 1e-6f, false, nullptr, nullptr).ok())
      << "pre and the mixes both given";
  EXPECT_FALSE(cuda::hc_expand_sinkhorn(nullptr, nullptr, from, 0, 1, 4, 8, false, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
