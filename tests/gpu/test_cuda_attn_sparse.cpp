// spw_cuda_attn sparse attention with sinks (cuda/attn/sparse_attn.h) against ref::sparse_attn_sink,
// with the rows composed as src/model/attention.cpp:171-178 does: [window positions max(0,t−W+1)..t,
// this step's rows from the chunk buffer and older ones from the ring at pos mod W ; the selected
// compressed entries]. KV rows are stored in the compact paged pools (V4.1: fp8/32 ring and fp4/e4m3
// entries; V4: fp8/64 + bf16 RoPE for both), the CPU sees the same values as f32 (fake quant).
// Cases: V4.1 real shapes (64 heads × 512, window 128, up to 512 selected entries) as a decode batch
// of sequences with different lengths (1 .. 1000, ring wrapped or not, the new token from the chunk
// buffer or already in the ring) and as a prefill chunk of one sequence past the ring's wrap; V4
// shapes with an HCA-style selection of all visible entries; awkward shapes (3 heads × 64, window 7;
// V4 with d_head 192). Selections contain −1 entries, which must be skipped. Both round_p_bf16 modes.
// Tolerance, relative to max|kv|: 1e-4 without the bf16 rounding of p (only the dot-product summation
// order and expf vs glibc exp differ, ~1e-6); 4e-3 with it, because a p_j within an ulp of a bf16
// rounding boundary can round the other way (2^-8 relative on that row's weight, Σ weights ≤ 1).
// The tensor-core path (bf16 q and p̃) against the same reference and tolerance: its products are exact, only
// the order of its f32 sums differs. Guards around the output, no NaN. Built into spw_gpu_tests;
// scripts/gpu_test.sh runs it.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "cuda/attn/sparse_attn.h"
#include "formats/dtypes.h"
#include "formats/quant.h"
#include "ops/ref/attention.h"
#include "test_cuda_attn_util.h"

namespace spw {
namespace {

using attn_test::DevBuf;
using attn_test::TestPool;

struct SeqSpec {
  int64_t p = 0;         // first position of this step's chunk
  int n = 1;             // tokens in the chunk (queries)
  int64_t n_entries = 0; // compressed entries stored
  int n_sel = 0;         // selected per query (≤ sel_stride), from entries < n_entries
  bool ring_has_chunk = false;  // decode: the new token's row is already in the ring
};

struct Case {
  const char* name = "";
  bool v41 = true;
  int n_heads = 64, d_head = 512, d_rope = 64, window = 128, sel_stride = 512;
  std::vector<SeqSpec> seqs;
};

// Whether got and want hold the same bits (zeros of either sign equal: a skipped row's 0 may come out as −0);
// on failure, how many values differ and the first.
::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  size_t differ = 0, first = got.size();
  for (size_t k = 0; k < got.size(); ++k)
    if (std::memcmp(&got[k], &want[k], sizeof(float)) != 0 && !(got[k] == 0.f && want[k] == 0.f)) {
      ++differ;
      if (first == got.size()) first = k;
    }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ << " values differ, first at " << first << ": " << got[first] << " vs "
                                       << want[first];
}

std::vector<float> fake_quant_as(const cuda::KvRowFormat& f, std::vector<float> x) {
  if (f.elem == cuda::KvElem::kFp8E4m3) fake_quant_fp8(x.data(), size_t(f.n_quant), size_t(f.block));
  else fake_quant_fp4_e4m3(x.data(), size_t(f.n_quant), size_t(f.block));
  for (int c = f.n_quant; c < f.n_quant + f.n_bf16; ++c) x[size_t(c)] = round_bf16(x[size_t(c)]);
  return x;
}

void run_case(const Case& c, bool round_p, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << c.name << " round_p_bf16=" << round_p << " H=" << c.n_heads << " D=" << c.d_head
                                  << " W=" << c.window);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int D = c.d_head, H = c.n_heads, W = c.window, n_seqs = int(c.seqs.size());
  const cuda::KvRowFormat ring_fmt = c.v41 ? cuda::kv_format_window_v41(D) : cuda::kv_format_window_v4(D, c.d_rope);
  const cuda::KvRowFormat comp_fmt =
      c.v41 ? cuda::kv_format_compressed_v41(D) : cuda::kv_format_compressed_v4(D, c.d_rope);
  auto random_row = [&](const cuda::KvRowFormat& f) {
    std::vector<float> x(static_cast<size_t>(D));
    for (auto& v : x) v = round_bf16(nd(rng));
    return fake_quant_as(f, x);
  };

  int64_t max_entries = 1;
  for (const SeqSpec& s : c.seqs) max_entries = std::max(max_entries, s.n_entries);
  TestPool ring(ring_fmt, n_seqs, W);
  TestPool comp(comp_fmt, n_seqs, max_entries);

  // Window rows of every position a query can see, per sequence (the same values in ring and chunk).
  std::vector<std::map<int64_t, std::vector<float>>> win(static_cast<size_t>(n_seqs));
  std::vector<std::vector<std::vector<float>>> entries(static_cast<size_t>(n_seqs));
  std::vector<float> ring_x, comp_x, chunk_kv;
  std::vector<int32_t> ring_s, comp_s;
  std::vector<int64_t> ring_r, comp_r;
  std::vector<int32_t> q_seq, chunk_row0, sel;
  std::vector<int64_t> q_pos, chunk_pos0;
  for (int s = 0; s < n_seqs; ++s) {
    const SeqSpec& sp = c.seqs[size_t(s)];
    const int32_t row0 = int32_t(chunk_kv.size() / size_t(D));
    for (int64_t pos = std::max<int64_t>(0, sp.p - W); pos < sp.p + sp.n; ++pos) {
      win[size_t(s)][pos] = random_row(ring_fmt);
      const std::vector<float>& x = win[size_t(s)][pos];
      if (pos >= sp.p) chunk_kv.insert(chunk_kv.end(), x.begin(), x.end());
      // The ring holds the W positions before the chunk, or (decode, token already stored) the last W.
      const bool in_ring = sp.ring_has_chunk ? pos >= sp.p + sp.n - W : pos < sp.p;
      if (in_ring) {
        ring_x.insert(ring_x.end(), x.begin(), x.end());
        ring_s.push_back(s);
        ring_r.push_back(pos % W);
      }
    }
    for (int64_t g = 0; g < sp.n_entries; ++g) {
      entries[size_t(s)].push_back(random_row(comp_fmt));
      comp_x.insert(comp_x.end(), entries[size_t(s)].back().begin(), entries[size_t(s)].back().end());
      comp_s.push_back(s);
      comp_r.push_back(g);
    }
    for (int i = 0; i < sp.n; ++i) {
      q_seq.push_back(s);
      q_pos.push_back(sp.p + i);
      chunk_pos0.push_back(sp.ring_has_chunk ? sp.p + sp.n : sp.p);
      chunk_row0.push_back(row0);
      // Selection: n_sel distinct entries ascending, every 5th slot −1, padded with −1.
      std::vector<int32_t> ids(size_t(sp.n_entries));
      for (int64_t g = 0; g < sp.n_entries; ++g) ids[size_t(g)] = int32_t(g);
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(std::min<size_t>(ids.size(), size_t(sp.n_sel)));
      std::sort(ids.begin(), ids.end());
      std::vector<int32_t> row(size_t(c.sel_stride), -1);
      size_t k = 0;
      for (size_t j = 0; j < row.size() && k < ids.size(); ++j)
        if (j % 5 != 4) row[j] = ids[k++];
      ASSERT_EQ(k, ids.size()) << "sel_stride too small for the case";
      sel.insert(sel.end(), row.begin(), row.end());
    }
  }
  attn_test::write_rows(ring.view(), ring_x, ring_s, ring_r);
  attn_test::write_rows(comp.view(), comp_x, comp_s, comp_r);

  const int n_q = int(q_seq.size());
  std::vector<float> q(size_t(n_q) * H * D), sink(static_cast<size_t>(H));
  for (auto& v : q) v = round_bf16(2.f * nd(rng));
  for (auto& v : sink) v = nd(rng);

  // CPU reference, rows as attention.cpp composes them.
  std::vector<float> want(size_t(n_q) * H * D);
  float kv_max = 0.f;
  const float scale = 1.0f / std::sqrt(float(D));
  for (int i = 0; i < n_q; ++i) {
    const int s = q_seq[size_t(i)];
    const int64_t t = q_pos[size_t(i)];
    std::vector<const float*> rows;
    for (int64_t pos = std::max<int64_t>(0, t - W + 1); pos <= t; ++pos) rows.push_back(win[size_t(s)].at(pos).data());
    for (int j = 0; j < c.sel_stride; ++j) {
      const int32_t g = sel[size_t(i) * c.sel_stride + j];
      if (g >= 0) rows.push_back(entries[size_t(s)][size_t(g)].data());
    }
    for (const float* r : rows)
      for (int ch = 0; ch < D; ++ch) kv_max = std::max(kv_max, std::fabs(r[ch]));
    ref::sparse_attn_sink(q.data() + size_t(i) * H * D, rows.data(), rows.size(), sink.data(), size_t(H), size_t(D),
                          scale, round_p, want.data() + size_t(i) * H * D);
  }

  DevBuf<float> dq(q), dsink(sink), dchunk(chunk_kv.empty() ? std::vector<float>(1) : chunk_kv);
  DevBuf<int32_t> dq_seq(q_seq), dchunk_row0(chunk_row0), dsel(sel);
  DevBuf<int64_t> dq_pos(q_pos), dchunk_pos0(chunk_pos0);
  DevBuf<float> dout(want.size(), 3.0e38f);
  cuda::SparseAttnArgs a;
  a.q = dq.get();
  a.sink = dsink.get();
  a.n_q = n_q, a.n_heads = H, a.d_head = D, a.window = W;
  a.scale = scale;
  a.round_p_bf16 = round_p;
  a.q_seq = dq_seq.get(), a.q_pos = dq_pos.get(), a.chunk_pos0 = dchunk_pos0.get(), a.chunk_row0 = dchunk_row0.get();
  a.chunk_kv = dchunk.get();
  a.ring = ring.view();
  a.sel = dsel.get();
  a.sel_stride = c.sel_stride;
  a.comp = comp.view();
  a.out = dout.get();
  a.path = cuda::SparseAttnPath::kOneBlock;
  a.decode_x4 = false;  // a channel per lane step first; the x4 decode is checked against it below
  Status st = cuda::sparse_attn_cuda(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dout.expect_guards("attention output");
  const double atol = (round_p ? 4e-3 : 1e-4) * kv_max;
  const std::vector<float> one_block = dout.download();
  attn_test::expect_close(one_block, want, atol, std::string(c.name) + (round_p ? " (bf16 p)" : " (exact p)"));

  // The split path (segments over blocks, caller scratch) sums in the same order: bit-identical, in both of its
  // forms (kSplit: one cooperative launch where the grid fits, which it does for every case here; kSplitLaunches:
  // three launches).
  const int64_t max_rows = int64_t(W) + c.sel_stride;
  DevBuf<float> scratch(cuda::sparse_attn_split_scratch_floats(n_q, H, D, max_rows), 7.0e37f);
  DevBuf<float> dout_split(want.size(), 3.0e38f);
  a.scratch = scratch.get(), a.scratch_floats = scratch.size();
  for (const cuda::SparseAttnPath path : {cuda::SparseAttnPath::kSplitLaunches, cuda::SparseAttnPath::kSplit}) {
    DevBuf<float> dout_path(want.size(), 3.0e38f);  // fresh, so a path that writes nothing cannot pass
    a.out = dout_path.get();
    a.path = path;
    st = cuda::sparse_attn_cuda(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dout_path.expect_guards("split attention output");
    scratch.expect_guards("split scratch");
    const std::vector<float> split = dout_path.download();
    EXPECT_TRUE(same_bits(split, one_block)) << c.name << ": split path (" << int(path) << ") against one block";
  }

  // Rows decoded four channels per lane step (decode_x4): the same tile values, so bit-identical results on the
  // one-block and split paths.
  a.decode_x4 = true;
  for (const cuda::SparseAttnPath path :
       {cuda::SparseAttnPath::kOneBlock, cuda::SparseAttnPath::kSplit, cuda::SparseAttnPath::kSplitLaunches}) {
    DevBuf<float> dout_x4(want.size(), 3.0e38f);
    a.out = dout_x4.get();
    a.path = path;
    st = cuda::sparse_attn_cuda(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dout_x4.expect_guards("attention output (x4 decode)");
    const std::vector<float> x4 = dout_x4.download();
    EXPECT_TRUE(same_bits(x4, one_block)) << c.name << ": the x4 row decode (path " << int(path) << ")";
  }
  a.decode_x4 = false;
  a.path = cuda::SparseAttnPath::kSplit;

  // The tensor-core path (bf16 q and p̃, d_head % 64 == 0): the same products summed in another order, so the
  // reference's tolerance; refused where its inputs are not bf16.
  DevBuf<float> dout_mma(want.size(), 3.0e38f);
  a.out = dout_mma.get();
  a.path = cuda::SparseAttnPath::kTensorCore;
  a.q_bf16 = true;
  st = cuda::sparse_attn_cuda(a, nullptr);
  if (round_p && D % 64 == 0) {
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dout_mma.expect_guards("tensor-core attention output");
    const std::vector<float> mma = dout_mma.download();
    attn_test::expect_close(mma, want, atol, std::string(c.name) + " (tensor cores)");
    // The x4 row decode gives the tensor-core kernel the same tile values: bit-identical.
    DevBuf<float> dout_mma_x4(want.size(), 3.0e38f);
    a.out = dout_mma_x4.get();
    a.decode_x4 = true;
    st = cuda::sparse_attn_cuda(a, nullptr);
    a.decode_x4 = false;
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dout_mma_x4.expect_guards("tensor-core attention output (x4 decode)");
    const std::vector<float> mma_x4 = dout_mma_x4.download();
    EXPECT_TRUE(same_bits(mma_x4, mma)) << c.name << ": the x4 row decode on tensor cores";
  } else {
    EXPECT_FALSE(st.ok()) << c.name << ": the tensor-core path took " << (round_p ? "d_head " + std::to_string(D) : "exact p");
  }
  // The split path on tensor cores (the decode path where kAuto splits), same tolerance, with its scratch.
  DevBuf<float> dout_split_mma(want.size(), 3.0e38f);
  a.out = dout_split_mma.get();
  a.path = cuda::SparseAttnPath::kSplitTensorCore;
  st = cuda::sparse_attn_cuda(a, nullptr);
  if (round_p && D % 64 == 0) {
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dout_split_mma.expect_guards("tensor-core split attention output");
    scratch.expect_guards("split scratch (tensor cores)");
    attn_test::expect_close(dout_split_mma.download(), want, atol, std::string(c.name) + " (split, tensor cores)");
  } else {
    EXPECT_FALSE(st.ok()) << c.name << ": the tensor-core split path took " << (round_p ? "d_head " + std::to_string(D) : "exact p");
  }
  a.q_bf16 = false;
  EXPECT_FALSE(cuda::sparse_attn_cuda(a, nullptr).ok()) << c.name << ": split tensor cores with q not bf16";
  a.path = cuda::SparseAttnPath::kTensorCore;
  EXPECT_FALSE(cuda::sparse_attn_cuda(a, nullptr).ok()) << c.name << ": tensor cores with q not bf16";
  a.path = cuda::SparseAttnPath::kSplit;
  a.out = dout_split.get();

  // Scratch one float short is refused, not overrun.
  a.scratch_floats = scratch.size() - 1;
  EXPECT_FALSE(cuda::sparse_attn_cuda(a, nullptr).ok());
  ring.expect_untouched("ring pool");
  comp.expect_untouched("compressed pool");
}

TEST(CudaAttnSparse, DecodeBatchV41RealShapes) {
  SPW_REQUIRE_GPU();
  Case c;
  c.name = "v4.1 decode batch";
  // Lengths 1 .. 1000; ratio-2 entries (t+1)/2, top-512 selections; some tokens already in the ring.
  for (int64_t t : {0, 49, 127, 128, 999}) {
    SeqSpec s;
    s.p = t;
    s.n_entries = (t + 1) / 2;
    s.n_sel = int(std::min<int64_t>(s.n_entries, 409));  // 409 ids + every 5th slot −1 fit 512
    s.ring_has_chunk = (t % 2 == 1);
    c.seqs.push_back(s);
  }
  run_case(c, true, 11);
  run_case(c, false, 12);
}

TEST(CudaAttnSparse, PrefillChunkV41RealShapes) {
  SPW_REQUIRE_GPU();
  Case c;
  c.name = "v4.1 prefill chunk past the ring wrap";
  SeqSpec s;
  s.p = 200, s.n = 40, s.n_entries = 120, s.n_sel = 100;
  c.seqs.push_back(s);
  SeqSpec first;  // a first chunk of another sequence in the same call (positions 0..29)
  first.p = 0, first.n = 30, first.n_entries = 15, first.n_sel = 15;
  c.seqs.push_back(first);
  run_case(c, true, 13);
  run_case(c, false, 14);
}

TEST(CudaAttnSparse, V4ShapesAllVisibleEntries) {
  SPW_REQUIRE_GPU();
  Case c;
  c.name = "v4 hca-style decode";
  c.v41 = false;
  c.sel_stride = 400;
  for (int64_t t : {5, 300, 40000}) {
    SeqSpec s;
    s.p = t;
    s.n_entries = std::min<int64_t>((t + 1) / 128 + 3, 300);
    s.n_sel = int(s.n_entries);
    c.seqs.push_back(s);
  }
  run_case(c, true, 15);
  run_case(c, false, 16);
}

TEST(CudaAttnSparse, AwkwardShapes) {
  SPW_REQUIRE_GPU();
  Case a;
  a.name = "awkward v4.1";
  a.n_heads = 3, a.d_head = 64, a.window = 7, a.sel_stride = 17;
  for (int64_t t : {0, 6, 7, 20}) {
    SeqSpec s;
    s.p = t, s.n = (t == 20 ? 9 : 1), s.n_entries = t / 2 + 1, s.n_sel = int(std::min<int64_t>(t / 2 + 1, 13));
    a.seqs.push_back(s);
  }
  run_case(a, true, 17);
  run_case(a, false, 18);
  Case b;
  b.name = "awkward v4";
  b.v41 = false, b.n_heads = 5, b.d_head = 192, b.window = 5, b.sel_stride = 1;
  for (int64_t t : {0, 4, 5, 33}) {
    SeqSpec s;
    s.p = t, s.n = (t == 33 ? 4 : 1), s.n_entries = 2, s.n_sel = 1;
    b.seqs.push_back(s);
  }
  run_case(b, true, 19);
}

// The shape of the V4 golden model's HCA layer (4 heads × 128, 64 RoPE channels, window 128, one selection slot that
// is often −1), where the tensor-core split path moved the engine's teacher-forced layer off the CPU (bench/results/engine_h200.md, 2026-12-04):
// a prefill chunk below the window, a first-token decode with nothing selected, a decode with the token in the ring.
TEST(CudaAttnSparse, V4GoldenHcaShape) {
  SPW_REQUIRE_GPU();
  Case c;
  c.name = "v4 golden hca";
  c.v41 = false, c.n_heads = 4, c.d_head = 128, c.window = 128, c.sel_stride = 1;
  SeqSpec chunk;
  chunk.p = 100, chunk.n = 17, chunk.n_entries = 1, chunk.n_sel = 1;
  SeqSpec first;
  first.p = 0, first.n = 1, first.n_entries = 0, first.n_sel = 0;
  SeqSpec ring;
  ring.p = 200, ring.n = 1, ring.n_entries = 1, ring.n_sel = 1, ring.ring_has_chunk = true;
  c.seqs = {chunk, first, ring};
  run_case(c, true, 21);
  run_case(c, false, 22);
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
