// spw_cuda_ops round_bf16, rms_norm and embedding_gather (cuda/ops/norm.h, embedding.h) against
// ref::round_bf16_inplace, ref::rms_norm and a host gather, at V4.1 shapes (d_model 5120, q per head
// 64×512, q_lora 1024, hc 4 copies, vocab 129280) and awkward ones (1, 7, 17, 127, 1023).
// Tolerances: round_bf16 and the gather are bit-exact. rms_norm sums squares in f64 in a tree order
// (the reference: sequentially), which changes f32(mean(x²)) only when it lies within ~1e-12 of an f32
// rounding midpoint: allowed 2 f32 ulp (2·FLT_EPSILON·|y|), or 1 bf16 ulp (2^-7·|y|) with bf16
// rounding on; at least 99% must be bit-exact (expected: all).
#if defined(SPW_HAVE_CUDA)
#include <cfloat>
#include <random>

#include "cuda/ops/embedding.h"
#include "cuda/ops/norm.h"
#include "formats/dtypes.h"
#include "ops/ref/linalg.h"
#include "test_cuda_ops_util.h"

namespace spw {
namespace {

using cuda_test::bits_equal;
using cuda_test::Guarded;
using cuda_test::no_nan;
using cuda_test::within;

std::vector<float> random_activations(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(nd(rng));
  return v;
}

TEST(CudaOpsNorm, RoundBf16BitExact) {
  SPW_REQUIRE_GPU();
  // Ties (low half exactly 0x8000, both parities), carries into the exponent, subnormals, ±0, ±inf,
  // NaNs with payloads, the largest finite values (round to inf), then random bit patterns.
  std::vector<uint32_t> bits = {0x3f808000, 0x3f818000, 0x3f80ffff, 0x3f7fffff, 0x7f7fffff, 0xff7fffff, 0x00000001,
                                0x80008000, 0x00018000, 0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                0x7f800001, 0xffa12345, 0x3fffffff, 0x477fe000};
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) bits.push_back(rng());
  for (size_t n : {size_t(1), size_t(7), size_t(17), size_t(127), size_t(1023), bits.size()}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    std::vector<float> x(n);
    std::memcpy(x.data(), bits.data(), n * 4);
    std::vector<float> want = x;
    ref::round_bf16_inplace(want.data(), n);
    Guarded<float> d(x);
    SPW_ASSERT_OK(cuda::round_bf16(d.get(), int64_t(n), nullptr));
    EXPECT_TRUE(bits_equal(d.download(), want));
    EXPECT_TRUE(d.guards_intact());
  }
}

void rms_norm_case(int64_t rows, int64_t d, bool weighted, bool in_place, bool round_out, float eps, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows=" << rows << " d=" << d << " weighted=" << weighted << " in_place=" << in_place
                                  << " round_out=" << round_out << " eps=" << eps);
  std::vector<float> x = random_activations(size_t(rows * d), 0.7f + float(seed % 5), seed);
  std::vector<float> w = random_activations(size_t(d), 0.3f, seed + 1);
  for (auto& v : w) v += 1.0f;
  std::vector<float> want(x.size());
  ref::rms_norm(x.data(), weighted ? w.data() : nullptr, want.data(), rows, d, eps);
  if (round_out) ref::round_bf16_inplace(want.data(), want.size());

  Guarded<float> dx(x), dw(w), dy(x.size());
  float* out = in_place ? dx.get() : dy.get();
  SPW_ASSERT_OK(cuda::rms_norm(dx.get(), weighted ? dw.get() : nullptr, out, rows, d, eps, round_out, nullptr));
  std::vector<float> got = in_place ? dx.download() : dy.download();
  ASSERT_TRUE(no_nan(got));
  const double rel = round_out ? std::ldexp(1.0, -7) : 2.0 * FLT_EPSILON;
  size_t n_exact = 0;
  EXPECT_TRUE(within(got, want, [&](size_t i) { return rel * std::fabs(want[i]); }, &n_exact));
  EXPECT_GE(double(n_exact), 0.99 * double(got.size())) << n_exact << " of " << got.size() << " bit-exact";
  EXPECT_TRUE(dx.guards_intact());
  EXPECT_TRUE(dy.guards_intact());
  EXPECT_TRUE(bits_equal(dw.download(), w)) << "weight modified";
}

TEST(CudaOpsNorm, RmsNormRealShapes) {
  SPW_REQUIRE_GPU();
  rms_norm_case(1, 5120, true, true, true, 1e-20f, 1);     // attn_norm, decode, V4.1 eps
  rms_norm_case(64, 5120, true, false, true, 1e-6f, 2);    // ffn_norm, V4 eps
  rms_norm_case(7 * 64, 512, false, true, false, 1e-20f, 3);  // weightless per-head q norm
  rms_norm_case(17, 1024, true, true, true, 1e-20f, 4);    // q_norm (q_lora_rank)
  rms_norm_case(33, 512, true, false, true, 1e-6f, 5);     // kv_norm
  rms_norm_case(5, 128, true, true, false, 1e-6f, 6);      // indexer key norm
}

TEST(CudaOpsNorm, RmsNormAwkwardSizes) {
  SPW_REQUIRE_GPU();
  uint32_t seed = 100;
  for (int64_t rows : {1, 7, 17, 127})
    for (int64_t d : {1, 7, 17, 127, 1023, 4097}) {
      ++seed;
      rms_norm_case(rows, d, seed % 2 == 0, seed % 3 == 0, seed % 4 < 2, 1e-6f, seed);
    }
  rms_norm_case(1023, 300, true, false, false, 1e-6f, 999);
}

void embedding_case(int64_t vocab, int64_t d, int64_t n_tokens, int n_copies, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "vocab=" << vocab << " d=" << d << " n_tokens=" << n_tokens << " copies=" << n_copies);
  std::vector<float> table = random_activations(size_t(vocab * d), 1.0f, seed);
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(n_tokens);
  for (auto& t : tokens) t = int32_t(rng() % vocab);
  tokens[0] = int32_t(vocab - 1);
  if (n_tokens > 1) tokens[1] = 0;
  std::vector<float> want(size_t(n_tokens * n_copies * d));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int c = 0; c < n_copies; ++c)
      std::memcpy(want.data() + (t * n_copies + c) * d, table.data() + tokens[t] * d, sizeof(float) * d);
  Guarded<float> dt(table), dout(want.size());
  Guarded<int32_t> dtok(tokens);
  SPW_ASSERT_OK(cuda::embedding_gather(dt.get(), vocab, d, dtok.get(), n_tokens, n_copies, dout.get(), nullptr));
  std::vector<float> got = dout.download();
  EXPECT_TRUE(no_nan(got));
  EXPECT_TRUE(bits_equal(got, want));
  EXPECT_TRUE(dout.guards_intact());
}

TEST(CudaOpsNorm, EmbeddingGather) {
  SPW_REQUIRE_GPU();
  embedding_case(129280, 64, 17, 1, 1);  // the real vocabulary (narrow rows keep the table small)
  embedding_case(1000, 5120, 7, 4, 2);   // d_model 5120, hc 4 copies
  embedding_case(1000, 5120, 1, 4, 3);
  embedding_case(7, 1, 1023, 1, 4);
  embedding_case(17, 127, 127, 3, 5);
}

TEST(CudaOpsNorm, EmbeddingBadIdGivesNaNRows) {
  SPW_REQUIRE_GPU();
  std::vector<float> table(10 * 8, 1.0f);
  std::vector<int32_t> tokens = {3, 10, -1, 9};
  Guarded<float> dt(table), dout(4 * 8);
  Guarded<int32_t> dtok(tokens);
  SPW_ASSERT_OK(cuda::embedding_gather(dt.get(), 10, 8, dtok.get(), 4, 1, dout.get(), nullptr));
  std::vector<float> got = dout.download();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(std::isnan(got[i]), i >= 8 && i < 24) << "index " << i;
  EXPECT_TRUE(dout.guards_intact());
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
