// spw_cuda_attn compact paged KV rows (cuda/attn/kv_pages.h) against formats/quant.h: for every row
// format of the model (V4.1 window fp8/32, V4 window fp8/64 + bf16 RoPE, V4.1 compressed fp4 with
// e4m3 scales/16, V4 compressed, index keys fp4/32) at real widths and awkward ones, rows of several
// sequences written to scattered logical rows of an interleaved paged pool, then read back:
// read(write(x)) must equal the reference's fake quant of x bit for bit (the bf16 tail: round_bf16),
// pages of no sequence stay untouched, guards intact. Rows include the hard cases: zeros, tiny and
// huge magnitudes, constant rows, amax exactly 448·2^k and 6·2^k (the pow2 scale boundary), ties of
// the e4m3/e2m1 rounding. Also the documented bytes per row (the memory planner's numbers).
// Built into spw_gpu_tests; scripts/gpu_test.sh runs it on the GPU machine.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include "formats/dtypes.h"
#include "formats/quant.h"
#include "test_cuda_attn_util.h"

namespace spw {
namespace {

using attn_test::DevBuf;
using attn_test::TestPool;

// The reference's fake quant of one row in the given format.
std::vector<float> fake_quant_row(const cuda::KvRowFormat& f, std::vector<float> x) {
  if (f.elem == cuda::KvElem::kF32) return x;  // exact rows: stored as given
  if (f.elem == cuda::KvElem::kFp8E4m3) fake_quant_fp8(x.data(), size_t(f.n_quant), size_t(f.block));
  else if (f.scale == cuda::KvScale::kUe8m0) fake_quant_fp4_ue8m0(x.data(), size_t(f.n_quant), size_t(f.block));
  else fake_quant_fp4_e4m3(x.data(), size_t(f.n_quant), size_t(f.block));
  for (int c = f.n_quant; c < f.n_quant + f.n_bf16; ++c) x[size_t(c)] = round_bf16(x[size_t(c)]);
  return x;
}

// Row r of a test set: mostly random, with the boundary cases at fixed rows.
std::vector<float> make_row(const cuda::KvRowFormat& f, int r, std::mt19937& rng) {
  const int d = cuda::kv_row_channels(f);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(d));
  const float lim = f.elem == cuda::KvElem::kFp8E4m3 ? 448.f : 6.f;
  switch (r % 8) {
    case 0: break;  // zeros
    case 1: for (auto& v : x) v = round_bf16(nd(rng) * 1e-30f); break;
    case 2: for (auto& v : x) v = round_bf16(nd(rng) * 3e4f); break;
    case 3: for (auto& v : x) v = -1.25f; break;
    case 4:  // amax = lim·2^k per block, and values on rounding ties
      for (int c = 0; c < d; ++c) {
        const float scale = std::ldexp(1.f, (c / f.block) % 7 - 3);
        x[size_t(c)] = (c % f.block == 0) ? lim * scale : (c % 2 ? 0.75f : 2.5f) * scale * (c % 3 ? 1.f : -1.f);
      }
      break;
    default:
      for (auto& v : x) v = round_bf16(nd(rng) * std::exp(nd(rng)));
  }
  return x;
}

void run_format(const char* name, const cuda::KvRowFormat& f, int n_seqs, int rows_per_seq, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << name << " n_quant=" << f.n_quant << " n_bf16=" << f.n_bf16 << " block=" << f.block);
  ASSERT_TRUE(cuda::kv_format_supported(f));
  std::mt19937 rng(seed);
  TestPool pool(f, n_seqs, 2 * rows_per_seq + 3);
  // Logical rows: each sequence writes rows_per_seq scattered rows (every other one, plus the last).
  std::vector<int32_t> seqs;
  std::vector<int64_t> rows;
  std::vector<float> x, want;
  const int d = cuda::kv_row_channels(f);
  int r = 0;
  for (int s = 0; s < n_seqs; ++s)
    for (int k = 0; k < rows_per_seq; ++k, ++r) {
      seqs.push_back(s);
      rows.push_back(k == rows_per_seq - 1 ? 2 * rows_per_seq + 2 : 2 * k + (s % 2));
      std::vector<float> row = make_row(f, r, rng);
      std::vector<float> q = fake_quant_row(f, row);
      x.insert(x.end(), row.begin(), row.end());
      want.insert(want.end(), q.begin(), q.end());
    }
  attn_test::write_rows(pool.view(), x, seqs, rows);
  DevBuf<int32_t> ds(seqs);
  DevBuf<int64_t> dr(rows);
  DevBuf<float> out(x.size(), 3.0e38f);
  Status st = cuda::kv_read_rows_cuda(pool.view(), ds.get(), dr.get(), int32_t(seqs.size()), out.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.expect_guards("read output");
  std::vector<float> got = out.download();
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << "first difference at row " << i / size_t(d) << " channel " << i % size_t(d) << " (input "
        << x[i] << "): got " << got[i] << " want " << want[i];
  pool.expect_untouched("pool");
}

TEST(CudaAttnKv, BytesPerRow) {
  EXPECT_EQ(cuda::kv_row_nbytes(cuda::kv_format_window_v41(512)), 528u);
  EXPECT_EQ(cuda::kv_row_nbytes(cuda::kv_format_window_v4(512, 64)), 584u);
  EXPECT_EQ(cuda::kv_row_nbytes(cuda::kv_format_compressed_v41(512)), 288u);
  EXPECT_EQ(cuda::kv_row_nbytes(cuda::kv_format_compressed_v4(512, 64)), 584u);
  EXPECT_EQ(cuda::kv_row_nbytes(cuda::kv_format_index_key(128)), 68u);
  EXPECT_EQ(cuda::kv_row_nbytes(cuda::kv_format_exact(512)), 2048u);  // f32, no scales
  EXPECT_EQ(cuda::kv_row_nbytes(cuda::kv_format_exact(7)), 28u);
}

TEST(CudaAttnKv, PageAllocator) {
  cuda::KvPageAllocator a(5);
  auto p = a.alloc(3);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.value(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(a.alloc(3).ok());
  EXPECT_EQ(a.n_free(), 2);
  a.free(p.value());
  EXPECT_EQ(a.n_free(), 5);
}

// A retained page goes back to the pool only when its last holder frees it.
TEST(CudaAttnKv, PageAllocatorCountsReferences) {
  cuda::KvPageAllocator a(4);
  auto p = a.alloc(2);
  ASSERT_TRUE(p.ok());
  a.retain({p.value()[0]});
  EXPECT_EQ(a.refs(p.value()[0]), 2);
  a.free(p.value());
  EXPECT_EQ(a.n_free(), 3) << "the shared page is still held";
  EXPECT_EQ(a.refs(p.value()[0]), 1);
  a.free({p.value()[0]});
  EXPECT_EQ(a.n_free(), 4);
  auto q = a.alloc(4);
  ASSERT_TRUE(q.ok());
  for (int32_t page : q.value()) EXPECT_EQ(a.refs(page), 1) << "a page handed out again starts at one reference";
}

TEST(CudaAttnKv, RealFormatsRoundTrip) {
  SPW_REQUIRE_GPU();
  run_format("window v4.1", cuda::kv_format_window_v41(512), 3, 70, 1);
  run_format("window v4", cuda::kv_format_window_v4(512, 64), 3, 70, 2);
  run_format("compressed v4.1", cuda::kv_format_compressed_v41(512), 4, 131, 3);
  run_format("compressed v4", cuda::kv_format_compressed_v4(512, 64), 2, 65, 4);
  run_format("index key", cuda::kv_format_index_key(128), 5, 200, 5);
}

TEST(CudaAttnKv, AwkwardFormatsRoundTrip) {
  SPW_REQUIRE_GPU();
  run_format("window v4.1 d=64", cuda::kv_format_window_v41(64), 1, 1, 6);
  run_format("window v4 d=192", cuda::kv_format_window_v4(192, 64), 7, 17, 7);
  run_format("compressed v4.1 d=48", cuda::kv_format_compressed_v41(48), 2, 127, 8);
  run_format("index key d=32", cuda::kv_format_index_key(32), 3, 9, 9);
  run_format("exact d=512", cuda::kv_format_exact(512), 2, 70, 10);
  run_format("exact d=7", cuda::kv_format_exact(7), 3, 9, 11);
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
