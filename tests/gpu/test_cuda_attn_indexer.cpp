// spw_cuda_attn indexer (cuda/attn/indexer.h) against the CPU indexer (src/model/indexer.cpp).
// - Scores: index keys written to the paged fp4 key pool, q fake-quantized (fp4, ue8m0/32) as
//   indexer.cpp:33 does, w bf16; reproduced here from index_scores (indexer.cpp:42-57, a file-local
//   function). Bit-exact in both rounding modes: same order, same roundings, no FMA on either side.
//   V4.1 (32 heads × 128) and V4 (64 × 128) shapes, awkward ones; several sequences with different
//   entry counts in one call, prefill-style visibility (visible < n_entries, 0). Entries past a
//   query's n_entries stay untouched.
// - Top-k: on those scores and on synthetic rows (heavy ties, −0/+0, −∞, n < k, n = 0, k = 0,
//   one row of 2^20), against select_top (indexer.cpp:60-65 = ref::topk_indices, drop non-finite,
//   sort): identical id lists, −1 padded.
// - Candidate blocks (V4.1 L20) and the re-index mask: against detail::select_candidate_blocks and
//   indexer.cpp:158-163, with the real 2048 blocks of 8 and a small keep count; exact.
// Built into spw_gpu_tests; scripts/gpu_test.sh runs it on the GPU machine.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include "cuda/attn/indexer.h"
#include "formats/dtypes.h"
#include "formats/quant.h"
#include "model/indexer.h"
#include "ops/ref/topk.h"
#include "test_cuda_attn_util.h"

namespace spw {
namespace {

using attn_test::DevBuf;
using attn_test::TestPool;

// indexer.cpp:42-57 (index_scores), for one query.
std::vector<float> cpu_index_scores(const float* q, const float* w, const std::vector<float>& keys, int64_t n_entries,
                                    int64_t visible, int Hi, int Di, bool round) {
  auto r = [round](float v) { return round ? round_bf16(v) : v; };
  std::vector<float> scores(size_t(n_entries), -INFINITY);
  for (int64_t g = 0; g < std::min(n_entries, visible); ++g) {
    const float* k = keys.data() + size_t(g) * Di;
    float acc = 0.f;
    for (int h = 0; h < Hi; ++h) {
      float dot = 0.f;
      for (int i = 0; i < Di; ++i) dot += q[size_t(h) * Di + i] * k[i];
      acc += r(std::max(r(dot), 0.f) * w[h]);
    }
    scores[size_t(g)] = r(acc);
  }
  return scores;
}

// indexer.cpp:60-65 (select_top).
std::vector<int32_t> cpu_select_top(const std::vector<float>& scores, int k) {
  std::vector<int32_t> top = ref::topk_indices(scores.data(), scores.size(), size_t(k));
  std::erase_if(top, [&](int32_t g) { return !std::isfinite(scores[size_t(g)]); });
  std::sort(top.begin(), top.end());
  return top;
}

// Runs topk_select_cuda on rows (each its own length) and compares with cpu_select_top.
void check_topk(const std::vector<std::vector<float>>& rows, int k, const std::string& what) {
  SCOPED_TRACE(testing::Message() << what << " k=" << k);
  size_t stride = 1;
  for (const auto& r : rows) stride = std::max(stride, r.size());
  std::vector<float> flat(rows.size() * stride, 7.f);
  std::vector<int64_t> n;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy(rows[i].begin(), rows[i].end(), flat.begin() + i * stride);
    n.push_back(int64_t(rows[i].size()));
  }
  const int out_stride = std::max(k, 1) + 3;
  DevBuf<float> dv(flat);
  DevBuf<int64_t> dn(n);
  DevBuf<int32_t> dout(rows.size() * size_t(out_stride), int32_t(0x5a5a5a5a));
  Status st = cuda::topk_select_cuda(dv.get(), int64_t(stride), dn.get(), int32_t(rows.size()), k, dout.get(),
                                     out_stride, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dout.expect_guards("top-k output");
  std::vector<int32_t> got = dout.download();
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<int32_t> want = cpu_select_top(rows[i], k);
    want.resize(size_t(out_stride), -1);
    for (int j = 0; j < out_stride; ++j)
      ASSERT_EQ(got[i * out_stride + size_t(j)], want[size_t(j)])
          << "row " << i << " (n=" << rows[i].size() << "): first difference at output " << j;
  }
}

struct IndexCase {
  const char* name;
  int n_heads, d_index;
  std::vector<int64_t> n_entries;                 // per sequence
  std::vector<std::vector<int64_t>> visible;      // per sequence: its queries' visible counts
};

// Scores on the GPU for all queries of the case; checks them against the CPU and returns them
// with each query's n_entries and visible (for the selection tests).
// rounds: IndexScoreArgs::rounds (0 = by launch size, which is one round for these few queries).
void run_scores(const IndexCase& c, bool round, uint32_t seed, std::vector<std::vector<float>>* scores_out,
                std::vector<int64_t>* visible_out, int rounds = 0) {
  SCOPED_TRACE(testing::Message() << c.name << " round_bf16=" << round << " rounds=" << rounds);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int Hi = c.n_heads, Di = c.d_index, n_seqs = int(c.n_entries.size());
  const cuda::KvRowFormat fmt = cuda::kv_format_index_key(Di);
  int64_t max_entries = 1;
  for (int64_t n : c.n_entries) max_entries = std::max(max_entries, n);
  TestPool pool(fmt, n_seqs, max_entries);
  std::vector<std::vector<float>> keys(static_cast<size_t>(n_seqs));
  std::vector<float> kx;
  std::vector<int32_t> ks;
  std::vector<int64_t> kr;
  for (int s = 0; s < n_seqs; ++s)
    for (int64_t g = 0; g < c.n_entries[size_t(s)]; ++g) {
      std::vector<float> x(static_cast<size_t>(Di));
      for (auto& v : x) v = round_bf16(nd(rng));
      kx.insert(kx.end(), x.begin(), x.end());
      ks.push_back(s);
      kr.push_back(g);
      fake_quant_fp4_ue8m0(x.data(), size_t(Di), 32);
      keys[size_t(s)].insert(keys[size_t(s)].end(), x.begin(), x.end());
    }
  attn_test::write_rows(pool.view(), kx, ks, kr);

  std::vector<int32_t> q_seq;
  std::vector<int64_t> q_n, q_vis;
  for (int s = 0; s < n_seqs; ++s)
    for (int64_t v : c.visible[size_t(s)]) {
      q_seq.push_back(s);
      q_n.push_back(c.n_entries[size_t(s)]);
      q_vis.push_back(v);
    }
  const int n_q = int(q_seq.size());
  std::vector<float> q(size_t(n_q) * Hi * Di), w(size_t(n_q) * Hi);
  for (auto& v : q) v = round_bf16(nd(rng));
  for (size_t r = 0; r < size_t(n_q) * Hi; ++r) fake_quant_fp4_ue8m0(q.data() + r * Di, size_t(Di), 32);
  for (auto& v : w) v = round_bf16(nd(rng) / std::sqrt(float(Di)) / std::sqrt(float(Hi)));

  const int64_t stride = max_entries + 5;
  DevBuf<float> dq(q), dw(w);
  DevBuf<int32_t> dseq(q_seq);
  DevBuf<int64_t> dn(q_n), dvis(q_vis);
  DevBuf<float> dscores(size_t(n_q) * stride, 3.0e38f);
  cuda::IndexScoreArgs a;
  a.q = dq.get(), a.w = dw.get(), a.n_q = n_q, a.n_heads = Hi, a.d_index = Di;
  a.q_seq = dseq.get(), a.n_entries = dn.get(), a.visible = dvis.get(), a.max_entries = max_entries;
  a.keys = pool.view();
  a.round_bf16 = round;
  a.scores = dscores.get(), a.score_stride = stride;
  a.rounds = rounds;
  Status st = cuda::index_scores_cuda(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dscores.expect_guards("scores");
  std::vector<float> got = dscores.download();
  for (int i = 0; i < n_q; ++i) {
    SCOPED_TRACE(testing::Message() << "query " << i << " n_entries=" << q_n[size_t(i)] << " visible=" << q_vis[size_t(i)]);
    const int s = q_seq[size_t(i)];
    std::vector<float> want = cpu_index_scores(q.data() + size_t(i) * Hi * Di, w.data() + size_t(i) * Hi,
                                               keys[size_t(s)], q_n[size_t(i)], q_vis[size_t(i)], Hi, Di, round);
    std::vector<float> mine(got.begin() + i * stride, got.begin() + i * stride + q_n[size_t(i)]);
    attn_test::expect_bits_equal(mine, want, "scores");
    for (int64_t g = q_n[size_t(i)]; g < stride; ++g)
      ASSERT_EQ(got[size_t(i * stride + g)], 3.0e38f) << "score past n_entries written at " << g;
    if (scores_out) scores_out->push_back(mine);
    if (visible_out) visible_out->push_back(q_vis[size_t(i)]);
  }
  pool.expect_untouched("key pool");
}

const IndexCase kV41{"v4.1 32x128", 32, 128, {1, 37, 1000, 5000}, {{1}, {18, 37}, {0, 999, 1000}, {5000, 4093}}};
const IndexCase kV4{"v4 64x128", 64, 128, {3, 700}, {{3, 1}, {700, 512, 511}}};

TEST(CudaAttnIndexer, ScoresBitExact) {
  SPW_REQUIRE_GPU();
  run_scores(kV41, true, 1, nullptr, nullptr);
  run_scores(kV41, false, 2, nullptr, nullptr);
  run_scores(kV4, true, 3, nullptr, nullptr);
  run_scores(IndexCase{"awkward 3x32", 3, 32, {17, 2}, {{17, 16, 5}, {2}}}, true, 4, nullptr, nullptr);
  run_scores(IndexCase{"awkward 1x64", 1, 64, {127}, {{127, 64}}}, false, 5, nullptr, nullptr);
  // Blocks of several rounds of entries (prefill chunks): 8 and an odd 3, with entries ending mid-round.
  for (int rounds : {3, 8}) {
    run_scores(kV41, true, 6, nullptr, nullptr, rounds);
    run_scores(kV4, false, 7, nullptr, nullptr, rounds);
    run_scores(IndexCase{"awkward 3x32", 3, 32, {17, 2}, {{17, 16, 5}, {2}}}, true, 8, nullptr, nullptr, rounds);
  }
}

TEST(CudaAttnIndexer, TopkOnScores) {
  SPW_REQUIRE_GPU();
  std::vector<std::vector<float>> scores;
  run_scores(kV41, true, 6, &scores, nullptr);
  check_topk(scores, 512, "v4.1 scores");
  check_topk(scores, 1024, "v4.1 scores");
}

TEST(CudaAttnIndexer, TopkSynthetic) {
  SPW_REQUIRE_GPU();
  std::mt19937 rng(7);
  std::vector<std::vector<float>> rows;
  rows.push_back({});                                   // n = 0
  rows.push_back({-INFINITY});                          // only −∞
  rows.push_back({0.f, -0.f, 0.f, -0.f, 1.f});         // ±0 ties
  for (int n : {1, 511, 512, 513, 3000}) {              // heavy ties: 7 distinct values, some −∞
    std::vector<float> r(static_cast<size_t>(n));
    for (auto& v : r) v = (rng() % 9 == 0) ? -INFINITY : float(int(rng() % 7) - 3);
    rows.push_back(r);
  }
  std::vector<float> big(size_t(1) << 20);            // 2^20 bf16 values: many ties
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : big) v = round_bf16(nd(rng));
  rows.push_back(big);
  for (int k : {0, 1, 7, 512, 1024}) check_topk(rows, k, "synthetic");
}

TEST(CudaAttnIndexer, CandidateBlocksAndReindex) {
  SPW_REQUIRE_GPU();
  std::vector<std::vector<float>> scores;
  std::vector<int64_t> visible;
  run_scores(kV41, true, 8, &scores, &visible);
  const int bs = 8;
  for (int keep : {2048, 3, 1}) {
    SCOPED_TRACE(testing::Message() << "candidate_topk_blocks=" << keep);
    const int n_q = int(scores.size());
    int64_t stride = 1;
    for (const auto& s : scores) stride = std::max<int64_t>(stride, int64_t(s.size()));
    std::vector<float> flat(size_t(n_q) * stride, -INFINITY);
    std::vector<int64_t> n;
    for (int i = 0; i < n_q; ++i) {
      std::copy(scores[size_t(i)].begin(), scores[size_t(i)].end(), flat.begin() + i * stride);
      n.push_back(int64_t(scores[size_t(i)].size()));
    }
    const int64_t bstride = (stride + bs - 1) / bs;
    DevBuf<float> dscores(flat);
    DevBuf<int64_t> dn(n), dvis(visible), dnb(size_t(n_q), int64_t(-7));
    DevBuf<float> dblock(size_t(n_q) * bstride, 3.0e38f);
    DevBuf<int32_t> dkept(size_t(n_q) * keep, int32_t(0x5a5a5a5a));
    DevBuf<uint8_t> dmask(size_t(n_q) * stride, uint8_t(0xcd));
    DevBuf<int32_t> dsel(size_t(n_q) * 512, int32_t(0x5a5a5a5a));
    Status st = cuda::candidate_block_scores_cuda(dscores.get(), stride, dn.get(), dvis.get(), n_q, stride, bs,
                                                  dblock.get(), bstride, dnb.get(), nullptr);
    ASSERT_TRUE(st.ok()) << st.error().message;
    st = cuda::topk_select_cuda(dblock.get(), bstride, dnb.get(), n_q, keep, dkept.get(), keep, nullptr);
    ASSERT_TRUE(st.ok()) << st.error().message;
    st = cuda::candidate_mask_cuda(dkept.get(), keep, dn.get(), n_q, stride, bs, dmask.get(), stride, nullptr);
    ASSERT_TRUE(st.ok()) << st.error().message;
    st = cuda::index_scores_apply_mask_cuda(dscores.get(), stride, dn.get(), n_q, stride, dmask.get(), stride, nullptr);
    ASSERT_TRUE(st.ok()) << st.error().message;
    st = cuda::topk_select_cuda(dscores.get(), stride, dn.get(), n_q, 512, dsel.get(), 512, nullptr);
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dmask.expect_guards("mask");
    dkept.expect_guards("kept blocks");
    dsel.expect_guards("selection");
    std::vector<uint8_t> mask = dmask.download();
    std::vector<int32_t> sel = dsel.download();
    for (int i = 0; i < n_q; ++i) {
      SCOPED_TRACE(testing::Message() << "query " << i << " n_entries=" << n[size_t(i)] << " visible=" << visible[size_t(i)]);
      std::vector<char> want = detail::select_candidate_blocks(scores[size_t(i)], bs, visible[size_t(i)] - 1, keep);
      for (int64_t g = 0; g < n[size_t(i)]; ++g)
        ASSERT_EQ(int(mask[size_t(i * stride + g)]), int(want[size_t(g)])) << "first mask difference at entry " << g;
      // indexer.cpp:158-163: a re-index layer masks its scores, then select_top.
      std::vector<float> masked = scores[size_t(i)];
      for (int64_t g = 0; g < n[size_t(i)]; ++g)
        if (!want[size_t(g)]) masked[size_t(g)] = -INFINITY;
      std::vector<int32_t> want_sel = cpu_select_top(masked, 512);
      want_sel.resize(512, -1);
      for (int j = 0; j < 512; ++j)
        ASSERT_EQ(sel[size_t(i) * 512 + size_t(j)], want_sel[size_t(j)]) << "first selection difference at " << j;
    }
  }
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
