// spw_cuda_ops rope_apply (cuda/ops/rope.h) against ref::rope_apply, per token position: V4.1 q
// [n_tokens, 64 heads, 512] and kv [n_tokens, 512] with d_rope 64, the indexer's 128-wide heads,
// plain (θ 10000) and YaRN frequency tables, forward and inverse, positions from 0 to past 2^20, and
// awkward sizes (d_rope 2, d = d_rope, 1..1023 vectors).
// Tolerance: angle and rotation are the reference's f32 operations without FMA, so outputs are
// bit-exact when cos/sin agree; the GPU's cos/sin are the correctly rounded f32 values and glibc's
// cosf/sinf can differ by 1 ulp, so each output may differ by 2·FLT_EPSILON·(|a| + |b|) (a, b: the
// pair's inputs). The untouched first d − d_rope channels must be bit-identical.
#if defined(SPW_HAVE_CUDA)
#include <cfloat>
#include <cstring>
#include <iostream>
#include <random>

#include "cuda/ops/norm.h"
#include "cuda/ops/rope.h"
#include "formats/dtypes.h"
#include "ops/ref/rope.h"
#include "test_cuda_ops_util.h"

namespace spw {
namespace {

using cuda_test::Guarded;
using cuda_test::no_nan;
using cuda_test::within;

void rope_case(const ref::RopeParams& rp, int64_t n_tokens, int64_t heads, int64_t d, bool inverse, int64_t pos0,
               int64_t pos_step, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "d_rope=" << rp.d_rope << " yarn=" << rp.yarn << " base=" << rp.base
                                  << " tokens=" << n_tokens << " heads=" << heads << " d=" << d << " inverse="
                                  << inverse << " pos0=" << pos0 << " step=" << pos_step);
  const std::vector<float> freqs = ref::rope_frequencies(rp);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(n_tokens * heads * d));
  for (auto& v : x) v = round_bf16(nd(rng));
  std::vector<int64_t> pos(n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) pos[t] = pos0 + t * pos_step;
  std::vector<float> want = x;
  for (int64_t t = 0; t < n_tokens; ++t)
    ref::rope_apply(want.data() + t * heads * d, size_t(heads), size_t(d), freqs, pos[t], inverse);

  Guarded<float> dx(x), df(freqs);
  Guarded<int64_t> dp(pos);
  SPW_ASSERT_OK(cuda::rope_apply(dx.get(), n_tokens * heads, d, rp.d_rope, df.get(), dp.get(), heads, inverse, nullptr));
  const std::vector<float> got = dx.download();
  ASSERT_TRUE(no_nan(got));
  const int64_t d_nope = d - rp.d_rope;
  auto tol = [&](size_t i) {
    const int64_t c = int64_t(i % size_t(d));
    if (c < d_nope) return 0.0;  // must be untouched
    const size_t pair = i - size_t((c - d_nope) % 2);
    return 2.0 * FLT_EPSILON * (std::fabs(x[pair]) + std::fabs(x[pair + 1]));
  };
  size_t n_exact = 0;
  EXPECT_TRUE(within(got, want, tol, &n_exact));
  std::cout << "  [rope] " << n_exact << " of " << got.size() << " bit-exact\n";
  EXPECT_TRUE(dx.guards_intact());
}

ref::RopeParams plain(int d_rope) { return {10000.f, d_rope, false}; }
ref::RopeParams yarn(int d_rope) { return {160000.f, d_rope, true, 16.f, 65536, 32.f, 1.f}; }

TEST(CudaOpsRope, RealShapes) {
  SPW_REQUIRE_GPU();
  rope_case(plain(64), 1, 64, 512, false, 4095, 1, 1);        // q, decode, window layer
  rope_case(yarn(64), 17, 64, 512, false, 100000, 1, 2);      // q, prefill chunk, compressed layer
  rope_case(plain(64), 127, 1, 512, false, 0, 1, 3);          // kv from position 0
  rope_case(yarn(64), 7, 64, 512, true, 1 << 20, 3, 4);       // inverse on the attention output
  rope_case(yarn(64), 33, 64, 128, false, 65530, 1, 5);       // indexer q (64 heads of 128)
  rope_case(yarn(64), 9, 1, 512, false, 0, 128, 6);           // compressed entries at g·r
}

TEST(CudaOpsRope, AwkwardSizes) {
  SPW_REQUIRE_GPU();
  rope_case(plain(2), 1, 1, 2, false, 5, 1, 11);
  rope_case(plain(2), 7, 3, 7, true, 1, 1, 12);
  rope_case(yarn(16), 17, 5, 17 + 16, false, 1000003, 17, 13);
  rope_case(plain(64), 1023, 1, 64, false, 0, 1, 14);
  rope_case(yarn(64), 3, 127, 1023, true, 2000000, 1, 15);
}

// The fused forms against the launches they replace, bit for bit (the same device operations in the same order):
// rope_apply_rounded = round_bf16 (round_in), rope_apply, round_bf16 (round_out); rms_norm_rope = rms_norm, then
// rope_apply_rounded with round_out (or rope_apply alone without rounding). x is not bf16-exact, so every
// rounding shows.
void fused_case(int64_t n_tokens, int64_t heads, int64_t d, int d_rope, bool inverse, bool round_in, bool round_out,
                bool with_norm, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "tokens=" << n_tokens << " heads=" << heads << " d=" << d << " d_rope=" << d_rope
                                  << " inverse=" << inverse << " round_in=" << round_in << " round_out=" << round_out
                                  << " norm=" << with_norm);
  const std::vector<float> freqs = ref::rope_frequencies(yarn(d_rope));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> x(size_t(n_tokens * heads * d)), w(static_cast<size_t>(d));
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = 1.0f + 0.1f * nd(rng);
  std::vector<int64_t> pos(n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) pos[t] = 1000 * t + 77;
  Guarded<float> fused(x), steps(x), dw(w), df(freqs);
  Guarded<int64_t> dp(pos);
  const int64_t rows = n_tokens * heads;
  if (with_norm) {
    SPW_ASSERT_OK(cuda::rms_norm_rope(fused.get(), dw.get(), fused.get(), rows, d, 1e-6f, round_out, d_rope, df.get(),
                                      dp.get(), heads, nullptr));
    SPW_ASSERT_OK(cuda::rms_norm(steps.get(), dw.get(), steps.get(), rows, d, 1e-6f, round_out, nullptr));
  } else {
    SPW_ASSERT_OK(cuda::rope_apply_rounded(fused.get(), rows, d, d_rope, df.get(), dp.get(), heads, inverse, round_in,
                                           round_out, nullptr));
    if (round_in) SPW_ASSERT_OK(cuda::round_bf16(steps.get(), int64_t(x.size()), nullptr));
  }
  SPW_ASSERT_OK(cuda::rope_apply(steps.get(), rows, d, d_rope, df.get(), dp.get(), heads, inverse, nullptr));
  if (round_out) SPW_ASSERT_OK(cuda::round_bf16(steps.get(), int64_t(x.size()), nullptr));
  const std::vector<float> a = fused.download(), b = steps.download();
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << differ << " of " << a.size() << " outputs differ from the separate launches";
  if (round_out) {
    size_t unrounded = 0;
    for (float v : a) unrounded += round_bf16(v) != v;
    EXPECT_EQ(unrounded, 0u) << "outputs not bf16";
  }
  EXPECT_TRUE(fused.guards_intact());
}

TEST(CudaOpsRope, FusedRoundingAndNormMatchSeparateLaunches) {
  SPW_REQUIRE_GPU();
  fused_case(1, 64, 512, 64, false, false, true, false, 21);   // V4.1 q after wq_b
  fused_case(3, 64, 512, 64, true, true, true, false, 22);     // attention output: round, inverse RoPE, round
  fused_case(2, 64, 128, 64, false, false, true, false, 23);   // indexer q
  fused_case(5, 3, 34, 16, true, true, false, false, 24);      // round_in alone, an odd pair count before the rope
  fused_case(4, 1, 512, 64, false, false, true, true, 25);     // kv: norm, RoPE, bf16
  fused_case(2, 64, 512, 64, false, false, true, true, 26);    // V4 q: weightless per-head norm (weighted here)
  fused_case(3, 1, 128, 64, false, false, false, true, 27);    // f32 activations: no rounding
  fused_case(1, 1, 5000, 64, false, false, true, true, 28);    // rows wider than the norm's block
}

TEST(CudaOpsRope, RejectsBadShapes) {
  EXPECT_FALSE(cuda::rope_apply(nullptr, 4, 64, 63, nullptr, nullptr, 1, false, nullptr).ok());   // odd d_rope
  EXPECT_FALSE(cuda::rope_apply(nullptr, 4, 32, 64, nullptr, nullptr, 1, false, nullptr).ok());   // d_rope > d
  EXPECT_FALSE(cuda::rope_apply(nullptr, 5, 64, 64, nullptr, nullptr, 2, false, nullptr).ok());   // 5 % 2
  EXPECT_FALSE(cuda::rope_apply_rounded(nullptr, 4, 65, 64, nullptr, nullptr, 1, false, false, true, nullptr).ok());  // odd d
  EXPECT_FALSE(cuda::rms_norm_rope(nullptr, nullptr, nullptr, 4, 64, 1e-6f, true, 66, nullptr, nullptr, 1, nullptr).ok());
  EXPECT_FALSE(cuda::rms_norm_rope(nullptr, nullptr, nullptr, 5, 64, 1e-6f, true, 64, nullptr, nullptr, 2, nullptr).ok());
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
