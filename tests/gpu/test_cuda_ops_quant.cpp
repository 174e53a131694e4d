// spw_cuda_ops activation fake quant and compact codes (cuda/ops/act_quant.h) against formats/quant.h
// applied row by row: fp8 (block 128 linears, V4.1 KV 512/32, V4 KV 448/64 inside 512-wide rows),
// fp4 ue8m0 (indexer keys 128/32), fp4 e4m3 (V4.1 compressed KV 512/16), plus awkward widths and
// blocks (1, 7, 17, 127, 1023 rows; blocks 1, 2, 7, 31). Inputs mix random scales with the hazards:
// all-zero blocks (the amax floors), subnormals, huge values, amax exactly 448·2^k or 6·2^k, values
// on rounding ties of the e4m3 / e2m1 grids.
// Everything is bit-exact: fake quant against the reference; the codes decoded on the host and by
// unpack_* must equal the reference's fake-quantized values; stride padding and guards untouched.
#if defined(SPW_HAVE_CUDA)
#include <random>

#include "cuda/ops/act_quant.h"
#include "formats/dtypes.h"
#include "formats/quant.h"
#include "test_cuda_ops_util.h"

namespace spw {
namespace {

using cuda_test::bits_equal;
using cuda_test::Guarded;
using cuda_test::no_nan;

enum class Q { kFp8, kFp4Ue8m0, kFp4E4m3 };
const char* name(Q q) { return q == Q::kFp8 ? "fp8" : q == Q::kFp4Ue8m0 ? "fp4_ue8m0" : "fp4_e4m3"; }

void fake_quant_ref(Q q, float* x, size_t n, size_t block) {
  if (q == Q::kFp8) fake_quant_fp8(x, n, block);
  else if (q == Q::kFp4Ue8m0) fake_quant_fp4_ue8m0(x, n, block);
  else fake_quant_fp4_e4m3(x, n, block);
}

// Row r of width n (stride ≥ n; the padding holds a marker value the kernels must not touch).
std::vector<float> make_rows(int64_t n_rows, int64_t n, int64_t stride, int block, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(-12.f, 12.f);
  std::vector<float> x(size_t(n_rows * stride), 1234.5f);
  const float grid_ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.0625f, 0.1875f, 17.f, 19.f, 104.f};
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x.data() + r * stride;
    for (int64_t b = 0; b < n; b += block) {
      const int kind = int(rng() % 8);
      const float scale = std::exp2(ud(rng));
      for (int i = 0; i < block; ++i) {
        float v = nd(rng) * scale;
        if (kind == 1) v = 0.f;
        if (kind == 2) v = nd(rng) * 1e-39f;                               // subnormal
        if (kind == 3) v = nd(rng) * 1e30f;                                // huge
        if (kind == 4) v = grid_ties[rng() % 12] * std::exp2(float(int(rng() % 9) - 4)) * (rng() % 2 ? 1.f : -1.f);
        if (kind == 5) v = std::exp(2.f * nd(rng)) * (rng() % 2 ? 1.f : -1.f);  // wide range in a block
        row[b + i] = v;
      }
      if (kind == 6) row[b + rng() % block] = 448.f * std::exp2(float(int(rng() % 21) - 10));  // amax = 448·2^k
      if (kind == 7) row[b + rng() % block] = -6.f * std::exp2(float(int(rng() % 21) - 10));   // amax = 6·2^k
    }
  }
  return x;
}

void quant_case(Q q, int64_t n_rows, int64_t n, int64_t stride, int block, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << name(q) << " rows=" << n_rows << " n=" << n << " stride=" << stride
                                  << " block=" << block << " seed=" << seed);
  const std::vector<float> x = make_rows(n_rows, n, stride, block, seed);
  std::vector<float> want = x;
  for (int64_t r = 0; r < n_rows; ++r) fake_quant_ref(q, want.data() + r * stride, size_t(n), size_t(block));

  // In-place fake quant.
  Guarded<float> dx(x);
  if (q == Q::kFp8) SPW_ASSERT_OK(cuda::fake_quant_fp8(dx.get(), n_rows, n, stride, block, nullptr));
  if (q == Q::kFp4Ue8m0) SPW_ASSERT_OK(cuda::fake_quant_fp4_ue8m0(dx.get(), n_rows, n, stride, block, nullptr));
  if (q == Q::kFp4E4m3) SPW_ASSERT_OK(cuda::fake_quant_fp4_e4m3(dx.get(), n_rows, n, stride, block, nullptr));
  std::vector<float> got = dx.download();
  EXPECT_TRUE(no_nan(got));
  EXPECT_TRUE(bits_equal(got, want)) << "fake quant (padding included)";
  EXPECT_TRUE(dx.guards_intact());

  // Compact codes: padded row strides for the codes, the scales and the unpacked rows.
  const bool fp4 = q != Q::kFp8;
  const int64_t n_blocks = n / block, q_stride = (fp4 ? n / 2 : n) + 3, s_stride = n_blocks + 5, y_stride = n + 9;
  const uint8_t pad = 0x5A;
  Guarded<float> src(x);
  Guarded<uint8_t> dq(std::vector<uint8_t>(size_t(n_rows * q_stride), pad));
  Guarded<uint8_t> ds(std::vector<uint8_t>(size_t(n_rows * s_stride), pad));
  Guarded<float> dy(std::vector<float>(size_t(n_rows * y_stride), -77.f));
  const cuda::Fp4Scale kind = q == Q::kFp4Ue8m0 ? cuda::Fp4Scale::kUe8m0 : cuda::Fp4Scale::kE4m3;
  if (fp4) {
    SPW_ASSERT_OK(cuda::pack_fp4(kind, src.get(), stride, n_rows, n, block, dq.get(), q_stride, ds.get(), s_stride, nullptr));
    SPW_ASSERT_OK(cuda::unpack_fp4(kind, dq.get(), q_stride, ds.get(), s_stride, n_rows, n, block, dy.get(), y_stride, nullptr));
  } else {
    SPW_ASSERT_OK(cuda::pack_fp8(src.get(), stride, n_rows, n, block, dq.get(), q_stride, ds.get(), s_stride, nullptr));
    SPW_ASSERT_OK(cuda::unpack_fp8(dq.get(), q_stride, ds.get(), s_stride, n_rows, n, block, dy.get(), y_stride, nullptr));
  }
  EXPECT_TRUE(bits_equal(src.download(), x)) << "pack modified its input";
  const std::vector<uint8_t> codes = dq.download(), scales = ds.download();
  const std::vector<float> unpacked = dy.download();
  std::vector<float> host_decoded, gpu_unpacked, want_rows;
  size_t bad_pad = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t sc = scales[r * s_stride + i / block];
      const float scale = q == Q::kFp4E4m3 ? e4m3_to_f32(sc) : e8m0_to_f32(sc);
      float v = 0;
      if (fp4) {
        const uint8_t byte = codes[r * q_stride + i / 2];
        v = e2m1_to_f32(i % 2 == 0 ? (byte & 0x0f) : (byte >> 4));
      } else {
        v = e4m3_to_f32(codes[r * q_stride + i]);
      }
      host_decoded.push_back(v * scale);
      gpu_unpacked.push_back(unpacked[r * y_stride + i]);
      want_rows.push_back(want[r * stride + i]);
    }
    for (int64_t i = (fp4 ? n / 2 : n); i < q_stride; ++i) bad_pad += codes[r * q_stride + i] != pad;
    for (int64_t b = n_blocks; b < s_stride; ++b) bad_pad += scales[r * s_stride + b] != pad;
    for (int64_t i = n; i < y_stride; ++i) bad_pad += unpacked[r * y_stride + i] != -77.f;
  }
  EXPECT_TRUE(bits_equal(host_decoded, want_rows)) << "codes decoded on the host vs fake quant";
  EXPECT_TRUE(bits_equal(gpu_unpacked, want_rows)) << "unpack(pack(x)) vs fake quant";
  EXPECT_EQ(bad_pad, 0u) << "row padding of codes, scales or unpacked rows written";
  EXPECT_TRUE(dq.guards_intact());
  EXPECT_TRUE(ds.guards_intact());
  EXPECT_TRUE(dy.guards_intact());
}

TEST(CudaOpsQuant, RealShapes) {
  SPW_REQUIRE_GPU();
  quant_case(Q::kFp8, 1, 5120, 5120, 128, 1);       // linear input, decode
  quant_case(Q::kFp8, 64, 5120, 5120, 128, 2);      // linear input, batch
  quant_case(Q::kFp8, 17, 1024, 1024, 128, 3);      // q_lora
  quant_case(Q::kFp8, 127, 512, 512, 32, 4);        // V4.1 window KV
  quant_case(Q::kFp8, 33, 448, 512, 64, 5);         // V4 KV: nope part of 512-wide rows
  quant_case(Q::kFp4Ue8m0, 64 * 7, 128, 128, 32, 6);  // indexer q / keys
  quant_case(Q::kFp4E4m3, 129, 512, 512, 16, 7);    // V4.1 compressed KV
}

TEST(CudaOpsQuant, AwkwardSizes) {
  SPW_REQUIRE_GPU();
  uint32_t seed = 50;
  for (Q q : {Q::kFp8, Q::kFp4Ue8m0, Q::kFp4E4m3}) {
    const bool fp4 = q != Q::kFp8;
    quant_case(q, 1, fp4 ? 2 : 1, fp4 ? 2 : 1, fp4 ? 2 : 1, ++seed);
    quant_case(q, 7, fp4 ? 14 : 7, 9 + 8, fp4 ? 14 : 7, ++seed);
    quant_case(q, 17, fp4 ? 34 : 17, 40, fp4 ? 2 : 17, ++seed);
    quant_case(q, 127, fp4 ? 62 * 3 : 31 * 3, 200, fp4 ? 62 : 31, ++seed);
    quant_case(q, 1023, 64, 64, 32, ++seed);
    quant_case(q, 3, 1024 * 3, 1024 * 3, 1024, ++seed);
  }
}

TEST(CudaOpsQuant, RejectsBadShapes) {
  EXPECT_FALSE(cuda::fake_quant_fp8(nullptr, 1, 100, 100, 32, nullptr).ok());    // 100 % 32
  EXPECT_FALSE(cuda::fake_quant_fp4_e4m3(nullptr, 1, 7, 7, 7, nullptr).ok());     // odd fp4 block
  EXPECT_FALSE(cuda::pack_fp8(nullptr, 1, 1, 64, 0, nullptr, 64, nullptr, 1, nullptr).ok());
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
