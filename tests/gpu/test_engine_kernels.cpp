// The engine's small kernels (engine/engine_kernels.h) against their CPU references, bit-exact.
// hadamard_rows_cuda: a warp per row splits each butterfly stage's disjoint pairs among its lanes, so it must
// equal ops/ref/hadamard.h's loops (same f32 additions, subtractions and scaling) on every element: row widths 1
// (no stage), 2, 32, 64 (fewer pairs than lanes), 128 (the V4 indexer's head dim), 2048 (many pairs per lane);
// 1 to 640 rows (several rows per block, a partial last block).
// moe_combine_cuda: each token's slot rows added from 0 in ascending expert id (ties by slot), −1 slots skipped,
// as a CPU loop with the same additions.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine_kernels.h"
#include "engine/moe_dispatch.h"
#include "ops/ref/hadamard.h"
#include "test_cuda_ops_util.h"

namespace spw {
namespace {

using cuda_test::bits_equal;
using cuda_test::Guarded;
using cuda_test::normal;

void hadamard_case(int64_t n_rows, int n, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "hadamard_rows rows=" << n_rows << " n=" << n);
  std::vector<float> want = normal(size_t(n_rows) * n, 0.f, 1.f, seed);
  Guarded<float> dx(want);
  ref::hadamard_rows(want.data(), size_t(n_rows), size_t(n));
  SPW_ASSERT_OK(engine::hadamard_rows_cuda(dx.get(), n_rows, n, nullptr));
  EXPECT_TRUE(bits_equal(dx.download(), want));
  EXPECT_TRUE(dx.guards_intact());
}

TEST(EngineKernels, HadamardRowsMatchReferenceBitExact) {
  SPW_REQUIRE_GPU();
  hadamard_case(1, 1, 1);
  hadamard_case(3, 2, 2);
  hadamard_case(5, 32, 3);
  hadamard_case(9, 64, 4);
  hadamard_case(64, 128, 5);   // V4 indexer: 64 heads × 128, one decode token
  hadamard_case(640, 128, 6);  // ten tokens
  hadamard_case(7, 2048, 7);
}

TEST(EngineKernels, HadamardRowsRejectsNonPowerOfTwo) {
  EXPECT_FALSE(engine::hadamard_rows_cuda(nullptr, 1, 96, nullptr).ok());
}

void combine_case(int64_t n_tokens, int top_k, int64_t d, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "moe_combine tokens=" << n_tokens << " top_k=" << top_k << " d=" << d);
  const std::vector<float> ys = normal(size_t(n_tokens * top_k * d), 0.f, 1.f, seed);
  std::vector<int32_t> experts(size_t(n_tokens * top_k));
  uint32_t r = seed;
  for (auto& e : experts) r = r * 1664525u + 1013904223u, e = int32_t((r >> 8) % 9) - 1;  // −1 .. 7: repeats, skips
  std::vector<float> want(size_t(n_tokens * d));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<int> order;
    for (int j = 0; j < top_k; ++j)
      if (experts[size_t(t * top_k + j)] >= 0) order.push_back(j);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return experts[size_t(t * top_k + a)] < experts[size_t(t * top_k + b)];
    });
    for (int64_t ch = 0; ch < d; ++ch) {
      float sum = 0.f;
      for (int j : order) sum += ys[size_t((t * top_k + j) * d + ch)];
      want[size_t(t * d + ch)] = sum;
    }
  }
  Guarded<float> dys(ys), dacc{want.size()};
  Guarded<int32_t> dex(experts);
  SPW_ASSERT_OK(engine::moe_combine_cuda(dys.get(), dex.get(), n_tokens, top_k, d, dacc.get(), nullptr));
  EXPECT_TRUE(bits_equal(dacc.download(), want));
  EXPECT_TRUE(dacc.guards_intact());
}

TEST(EngineKernels, MoeCombineAddsSlotsInExpertOrder) {
  SPW_REQUIRE_GPU();
  combine_case(1, 6, 5120, 11);
  combine_case(37, 6, 256, 12);
  combine_case(5, 16, 64, 13);  // the most slots the kernel takes
  combine_case(3, 1, 100, 14);
}

TEST(EngineKernels, MoeCombineRejectsTooManySlots) {
  EXPECT_FALSE(engine::moe_combine_cuda(nullptr, nullptr, 1, 17, 8, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace spw
#endif
