// spw_cuda_attn compressor pooling (cuda/attn/compressor.h) against the CPU's
// detail::compressor_push (src/model/compressor.cpp), fed as src/model/attention.cpp:52-55 feeds it
// (score + ape[pos mod ratio] before the push). Shapes: V4 main ratio 4 with overlap (width 1024),
// V4 indexer ratio 4 overlap (width 256), V4 ratio 128 (width 512), V4.1 ratio 2 (width 512, no ape),
// awkward (ratio 3 overlap width 70, ratio 5 width 33, ratio 1). Three sequences share the same token
// rows in one batch of pushes: one takes them all in one chunk, one a token at a time, one in
// irregular chunks; every step pushes all three (distinct state slots) in one call.
// Asserts: the three sequences' entries are bit-identical (chunking must not matter); entries match
// the CPU within 3e-5·max|kv| (expf vs glibc exp differ by ≤ 2 ulp per weight; sums and products are
// rounded as the CPU does, but the perturbed terms make the ≤ 256 partial sums round differently:
// ~√n ulp typical, n ulp ≈ 1.5e-5 worst case for 256 terms, plus the weights); the final device state equals
// the CPU's CompressorState exactly (pure copies); guards intact, no NaN.
// Built into spw_gpu_tests; scripts/gpu_test.sh runs it on the GPU machine.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include "cuda/attn/compressor.h"
#include "model/compressor.h"
#include "test_cuda_attn_util.h"

namespace spw {
namespace {

using attn_test::DevBuf;

void run_case(const char* name, int ratio, int width, bool overlap, bool with_ape, int n_tokens,
              std::vector<int> irregular, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << name << " ratio=" << ratio << " width=" << width << " overlap=" << overlap
                                  << " ape=" << with_ape << " n_tokens=" << n_tokens);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const cuda::CompressorShape shape{ratio, width, overlap};
  const int d_out = shape.d_out();
  std::vector<float> kv(size_t(n_tokens) * width), score(size_t(n_tokens) * width), ape(size_t(ratio) * width);
  for (auto& v : kv) v = nd(rng);
  for (auto& v : score) v = 3.f * nd(rng);
  for (auto& v : ape) v = nd(rng);

  // CPU: one token at a time, score + ape first (attention.cpp:54).
  CompressorState cpu;
  std::vector<float> want, entry;
  for (int t = 0; t < n_tokens; ++t) {
    std::vector<float> sc(score.begin() + size_t(t) * width, score.begin() + size_t(t + 1) * width);
    if (with_ape)
      for (int ch = 0; ch < width; ++ch) sc[size_t(ch)] += ape[size_t(t % ratio) * width + ch];
    if (detail::compressor_push(cpu, ratio, width, overlap, t, kv.data() + size_t(t) * width, sc.data(), entry))
      want.insert(want.end(), entry.begin(), entry.end());
  }
  const int n_entries = n_tokens / ratio;
  ASSERT_EQ(want.size(), size_t(n_entries) * d_out);

  // GPU: three sequences (slots 0, 1, 2) with different chunk schedules.
  const size_t state_n = size_t(3) * ratio * width;
  DevBuf<float> s_kv(state_n, 1.f), s_score(state_n, 1.f), s_pkv(state_n, 1.f), s_pscore(state_n, 1.f);
  cuda::CompressorStates st{s_kv.get(), s_score.get(), overlap ? s_pkv.get() : nullptr,
                            overlap ? s_pscore.get() : nullptr};
  for (int slot = 0; slot < 3; ++slot) {
    Status r = cuda::compressor_state_reset_cuda(shape, st, slot, nullptr);
    ASSERT_TRUE(r.ok()) << r.error().message;
  }
  DevBuf<float> dape(ape);
  DevBuf<float> out(size_t(3) * std::max(n_entries, 1) * d_out, 3.0e38f);  // [slot][entry][d_out]
  std::vector<std::vector<int>> schedule(3);
  schedule[0] = {n_tokens};
  schedule[1].assign(size_t(n_tokens), 1);
  for (int left = n_tokens, k = 0; left > 0; ++k) {
    const int n = std::min(left, irregular[size_t(k) % irregular.size()]);
    schedule[2].push_back(n);
    left -= n;
  }
  std::vector<int> done(3, 0);
  std::vector<size_t> next(3, 0);
  for (int step = 0;; ++step) {
    std::vector<float> in_kv, in_score;
    std::vector<int32_t> slot, n_tok, in_row0, out_row0;
    std::vector<int64_t> pos0;
    int max_e = 0;
    for (int s = 0; s < 3; ++s) {
      if (next[size_t(s)] >= schedule[size_t(s)].size()) continue;
      const int n = schedule[size_t(s)][next[size_t(s)]++];
      const int p = done[size_t(s)];
      slot.push_back(s);
      pos0.push_back(p);
      n_tok.push_back(n);
      in_row0.push_back(int32_t(in_kv.size() / size_t(width)));
      out_row0.push_back(s * std::max(n_entries, 1) + p / ratio);
      max_e = std::max(max_e, (p + n) / ratio - p / ratio);
      in_kv.insert(in_kv.end(), kv.begin() + size_t(p) * width, kv.begin() + size_t(p + n) * width);
      in_score.insert(in_score.end(), score.begin() + size_t(p) * width, score.begin() + size_t(p + n) * width);
      done[size_t(s)] += n;
    }
    if (slot.empty()) break;
    DevBuf<float> dkv(in_kv), dscore(in_score);
    DevBuf<int32_t> dslot(slot), dn(n_tok), din(in_row0), dout_row(out_row0);
    DevBuf<int64_t> dpos(pos0);
    cuda::CompressorChunks ch{dslot.get(), dpos.get(), dn.get(), din.get(), dout_row.get()};
    Status r = cuda::compressor_push_cuda(shape, st, dkv.get(), dscore.get(), with_ape ? dape.get() : nullptr, ch,
                                          int32_t(slot.size()), max_e, out.get(), nullptr);
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.error().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "step " << step;
  }
  out.expect_guards("entries");
  s_kv.expect_guards("state kv");
  s_score.expect_guards("state score");
  std::vector<float> got = out.download();
  const size_t per_slot = size_t(std::max(n_entries, 1)) * d_out;
  std::vector<float> one_shot(got.begin(), got.begin() + size_t(n_entries) * d_out);
  for (int s = 1; s < 3; ++s) {
    std::vector<float> other(got.begin() + s * per_slot, got.begin() + s * per_slot + size_t(n_entries) * d_out);
    attn_test::expect_bits_equal(other, one_shot, s == 1 ? "token-at-a-time vs one chunk" : "irregular chunks vs one chunk");
  }
  attn_test::expect_close(one_shot, want, 3e-5 * attn_test::max_abs(kv), std::string(name) + " entries vs CPU");

  // Final state of every slot equals the CPU's (kv and score rows; overlap: the previous group).
  auto expect_state = [&](const DevBuf<float>& buf, const std::vector<float>& cpu_rows, const char* what) {
    std::vector<float> all = buf.download();
    for (int s = 0; s < 3; ++s) {
      std::vector<float> mine(all.begin() + size_t(s) * ratio * width, all.begin() + size_t(s + 1) * ratio * width);
      attn_test::expect_bits_equal(mine, cpu_rows, std::string(what) + " slot " + std::to_string(s));
    }
  };
  expect_state(s_kv, cpu.kv, "state kv");
  expect_state(s_score, cpu.score, "state score");
  if (overlap && cpu.has_prev) {
    expect_state(s_pkv, cpu.prev_kv, "state prev kv");
    expect_state(s_pscore, cpu.prev_score, "state prev score");
  }
}

TEST(CudaAttnCompressor, V4Shapes) {
  SPW_REQUIRE_GPU();
  run_case("v4 main ratio 4", 4, 1024, true, true, 67, {5, 3, 8, 1}, 1);
  run_case("v4 indexer ratio 4", 4, 256, true, true, 41, {2, 7}, 2);
  run_case("v4 ratio 128", 128, 512, false, true, 300, {100, 29, 128}, 3);
}

TEST(CudaAttnCompressor, V41Ratio2) {
  SPW_REQUIRE_GPU();
  run_case("v4.1 ratio 2", 2, 512, false, false, 101, {3, 4, 1}, 4);
}

TEST(CudaAttnCompressor, AwkwardShapes) {
  SPW_REQUIRE_GPU();
  run_case("ratio 3 overlap", 3, 70, true, true, 23, {2, 5}, 5);
  run_case("ratio 5", 5, 33, false, true, 17, {4, 7}, 6);
  run_case("ratio 1", 1, 33, false, false, 9, {2}, 7);
  run_case("no complete group", 4, 16, true, true, 3, {2}, 8);
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
