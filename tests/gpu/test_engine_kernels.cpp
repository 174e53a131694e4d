// The engine's small kernels (engine/engine_kernels.h) against their CPU references, bit-exact.
// hadamard_rows_cuda: a warp per row splits each butterfly stage's disjoint pairs among its lanes, so it must
// equal ops/ref/hadamard.h's loops (same f32 additions, subtractions and scaling) on every element: row widths 1
// (no stage), 2, 32, 64 (fewer pairs than lanes), 128 (the V4 indexer's head dim), 2048 (many pairs per lane);
// 1 to 640 rows (several rows per block, a partial last block).
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include "engine/engine_kernels.h"
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

}  // namespace
}  // namespace spw
#endif
