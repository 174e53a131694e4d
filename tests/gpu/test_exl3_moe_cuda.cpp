// spw_cuda fused EXL3 MoE decode (cuda/exl3_moe.h) against a reference composed from exl3_matmul_ref
// (fp64 decode) and ref::swiglu: small and real V4.1 shapes (d=5120, f=2304), 1..4 tokens, top-6,
// repeated experts, skipped (−1) slots, clamp on/off, every codebook, a second call and a CUDA-graph
// replay (both bit-identical to the first: the kernel is deterministic), and every token run alone
// (bit-identical to its row of the batch: a token's sums never depend on the others). Output guard regions
// keep their sentinel; no NaN.
// Tolerance: RMS error ≤ 3e-3·RMS(y), max ≤ 3e-2·RMS(y) — x and h are each rounded to fp16 once after
// their rotations (≈2^-12 relative per element, two stages), everything else is fp32.
#if defined(SPW_HAVE_CUDA)
#include "cuda/exl3_moe.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/ref/moe.h"
#include "gpu_test_util.h"

namespace spw {
namespace {

using gpu_test::upload;

struct HostExpert {
  std::vector<uint16_t> trellis[3];
  Exl3Tensor t[3];  // w1, w3, w2
};

Exl3Tensor make_linear(std::vector<uint16_t>& trellis, int64_t k, int64_t n, int K, Exl3Codebook cb, bool bias,
                       std::mt19937& rng) {
  std::normal_distribution<float> nd(0, 1);
  trellis.resize(static_cast<size_t>(k / 16) * (n / 16) * 16 * K);
  for (auto& w : trellis) w = rng() & 0xffff;
  Exl3Tensor t;
  t.k = k, t.n = n, t.bits.k_x2 = 2 * K, t.codebook = cb, t.trellis = trellis.data();
  t.suh.resize(k), t.svh.resize(n);
  // Scales keep g, u near ±1..10 so the clamp (limit 7) bites on some elements.
  for (auto& v : t.suh) v = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * 0.5 / std::sqrt(double(k)) * (1 + 0.2 * nd(rng)));
  for (auto& v : t.svh) v = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * 3.0 * (1 + 0.2 * nd(rng)));
  if (bias) {
    t.bias.resize(n);
    for (auto& v : t.bias) v = exl3_f64_to_f16(0.1 * nd(rng));
  }
  return t;
}

// ws_tokens: the workspace holds that many tokens (default T); fewer makes the call launch in pieces.
// ref_round: the engine's reference_rounding mode (bf16 roundings of g, u, h and each slot's output, slots added
// in expert order), held to the fp32 reference with room for those roundings: each bf16 rounding adds a relative
// rms error of at most 2^-8/√12 ≈ 1.1e-3, four of them on every path (measured: 3.3e-3·rms at 10 slots). A lost
// or doubled slot would be off by ~rms/√topk ≫ that.
void run_case(int64_t d, int64_t f, int E, int K, Exl3Codebook cb, int T, int topk, float limit, bool bias,
              uint32_t seed, bool ref_round = false, int ws_tokens = 0) {
  if (ws_tokens <= 0) ws_tokens = T;
  SCOPED_TRACE(testing::Message() << "d=" << d << " f=" << f << " E=" << E << " K=" << K
                                  << " cb=" << exl3_codebook_name(cb) << " T=" << T << " topk=" << topk
                                  << " ref_round=" << ref_round << " workspace tokens=" << ws_tokens);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<HostExpert> hx(E);
  for (auto& e : hx) {
    e.t[0] = make_linear(e.trellis[0], d, f, K, cb, bias, rng);
    e.t[1] = make_linear(e.trellis[1], d, f, K, cb, bias, rng);
    e.t[2] = make_linear(e.trellis[2], f, d, K, cb, bias, rng);
  }
  std::vector<float> x(T * d);
  for (auto& v : x) v = nd(rng);
  std::vector<int32_t> idx(T * topk);
  std::vector<float> w(T * topk);
  for (int i = 0; i < T * topk; ++i) idx[i] = rng() % E, w[i] = 0.1f + 0.9f * (rng() % 1000) / 1000.f;
  if (T * topk > 2) idx[1] = idx[0];  // one expert twice for the same token
  if (T * topk > 3) idx[3] = -1;      // a slot served elsewhere

  // Reference.
  std::vector<float> ref(T * d, 0.f), g(f), u(f), h(f), yo(d);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < topk; ++j) {
      const int e = idx[t * topk + j];
      if (e < 0) continue;
      exl3_matmul_ref(hx[e].t[0], x.data() + t * d, 1, g.data());
      exl3_matmul_ref(hx[e].t[1], x.data() + t * d, 1, u.data());
      ref::swiglu(g.data(), u.data(), h.data(), f, limit, w[t * topk + j]);
      exl3_matmul_ref(hx[e].t[2], h.data(), 1, yo.data());
      for (int i = 0; i < d; ++i) ref[t * d + i] += yo[i];
    }

  // Device copies.
  std::vector<Exl3CudaExpert> table(E);
  std::vector<void*> owned;
  for (int e = 0; e < E; ++e)
    for (int q = 0; q < 3; ++q) {
      const Exl3Tensor& t = hx[e].t[q];
      table[e].trellis[q] = upload(hx[e].trellis[q]);
      table[e].suh[q] = upload(t.suh);
      table[e].svh[q] = upload(t.svh);
      table[e].bias[q] = bias ? upload(t.bias) : nullptr;
      owned.insert(owned.end(), {(void*)table[e].trellis[q], (void*)table[e].suh[q], (void*)table[e].svh[q],
                                 (void*)table[e].bias[q]});
    }
  Exl3CudaMoeLayer layer;
  layer.experts = upload(table), layer.n_experts = E, layer.d = d, layer.f = f;
  layer.bits.k_x2 = 2 * K, layer.codebook = cb, layer.swiglu_limit = limit;
  layer.reference_rounding = ref_round;
  ASSERT_TRUE(exl3_cuda_moe_supports(layer));
  float* dx = upload(x);
  int32_t* didx = upload(idx);
  float* dw = upload(w);
  const int64_t guard = 128;
  std::vector<float> yh(T * d + 2 * guard, 3.0e38f);
  float* dy = upload(yh);
  Exl3CudaMoeWorkspace ws;
  ASSERT_TRUE(exl3_cuda_moe_workspace_alloc(ws, std::min(T, ws_tokens) * topk, d, f).ok());

  auto fetch_and_check = [&](const char* what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(yh.data(), dy, yh.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < guard; ++i) {
      ASSERT_EQ(yh[i], 3.0e38f);
      ASSERT_EQ(yh[guard + T * d + i], 3.0e38f);
    }
    double rms = 0, e2 = 0, emax = 0;
    for (int64_t i = 0; i < T * d; ++i) {
      const float v = yh[guard + i];
      ASSERT_FALSE(std::isnan(v)) << i;
      const double df = double(v) - ref[i];
      rms += double(ref[i]) * ref[i], e2 += df * df, emax = std::max(emax, std::fabs(df));
    }
    rms = std::sqrt(rms / (T * d));
    ASSERT_GT(rms, 0.0);
    EXPECT_LT(std::sqrt(e2 / (T * d)), (ref_round ? 6e-3 : 3e-3) * rms);
    EXPECT_LT(emax, (ref_round ? 6e-2 : 3e-2) * rms);
  };
  std::vector<float> first;
  auto expect_first_bits = [&](const char* what) {
    SCOPED_TRACE(what);
    for (int64_t i = 0; i < T * d; ++i)
      ASSERT_EQ(std::memcmp(&yh[guard + i], &first[i], sizeof(float)), 0)
          << "element " << i << ": " << yh[guard + i] << " vs " << first[i];
  };
  for (int rep = 0; rep < 2; ++rep) {
    auto st = exl3_moe_decode_cuda(layer, dx, didx, dw, T, topk, dy + guard, ws);
    ASSERT_TRUE(st.ok()) << st.error().message;
    fetch_and_check(rep == 0 ? "first call" : "second call");
    if (rep == 0) first.assign(yh.begin() + guard, yh.begin() + guard + T * d);
    else expect_first_bits("second call");
  }
  // Each token alone: the same bits as its row of the batch.
  for (int t = 0; T > 1 && t < T; ++t) {
    SCOPED_TRACE(testing::Message() << "token " << t << " alone");
    float* dy1 = upload(std::vector<float>(d, 0.f));
    auto st = exl3_moe_decode_cuda(layer, dx + t * d, didx + t * topk, dw + t * topk, 1, topk, dy1, ws);
    ASSERT_TRUE(st.ok()) << st.error().message;
    std::vector<float> alone(d);
    ASSERT_EQ(cudaMemcpy(alone.data(), dy1, d * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dy1);
    for (int64_t i = 0; i < d; ++i)
      ASSERT_EQ(std::memcmp(&alone[i], &first[t * d + i], sizeof(float)), 0)
          << "column " << i << ": " << alone[i] << " alone vs " << first[t * d + i] << " in the batch";
  }
  // Captured into a CUDA graph and replayed twice.
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  auto st = exl3_moe_decode_cuda(layer, dx, didx, dw, T, topk, dy + guard, ws, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaMemset(dy + guard, 0, T * d * sizeof(float)), cudaSuccess);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  fetch_and_check("graph replay");
  expect_first_bits("graph replay");
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(s);

  exl3_cuda_moe_workspace_free(ws);
  for (void* p : owned) cudaFree(p);
  cudaFree(const_cast<Exl3CudaExpert*>(layer.experts)), cudaFree(dx), cudaFree(didx), cudaFree(dw), cudaFree(dy);
}

TEST(Exl3MoeCuda, SmallEveryCodebook) {
  SPW_REQUIRE_GPU();
  run_case(256, 128, 8, 3, Exl3Codebook::kMul1, 1, 4, 7.f, false, 1);
  run_case(512, 256, 8, 2, Exl3Codebook::kMcg, 3, 6, 7.f, true, 2);
  run_case(384, 640, 5, 4, Exl3Codebook::k3Inst, 2, 6, 0.f, false, 3);
  run_case(256, 384, 6, 6, Exl3Codebook::kMul1, 4, 3, 7.f, true, 4);
}

// More slots than the combine loads at once (8), a duplicate expert and a −1 slot, in both rounding modes.
TEST(Exl3MoeCuda, ManySlotsBothRoundings) {
  SPW_REQUIRE_GPU();
  run_case(256, 128, 12, 3, Exl3Codebook::kMul1, 2, 10, 7.f, true, 5, false);
  run_case(256, 128, 12, 3, Exl3Codebook::kMul1, 2, 10, 7.f, true, 6, true);
  run_case(512, 256, 8, 3, Exl3Codebook::kMul1, 3, 6, 7.f, false, 7, true);
}

TEST(Exl3MoeCuda, RealV41Shapes) {
  SPW_REQUIRE_GPU();
  run_case(5120, 2304, 8, 3, Exl3Codebook::kMul1, 1, 6, 10.f, false, 11);
  run_case(5120, 2304, 8, 3, Exl3Codebook::kMul1, 2, 6, 10.f, false, 12);
}

// 16 tokens (a batch-invariant decode call's most) in the engine's rounding mode: every token alone gives
// its row's bits.
TEST(Exl3MoeCuda, SixteenTokensEachAsAlone) {
  SPW_REQUIRE_GPU();
  run_case(1024, 512, 24, 3, Exl3Codebook::kMul1, 16, 6, 10.f, false, 13, true);
}

// 40 tokens (a batch-invariant decode of 40 sequences) through a workspace of 16 tokens: launches of 16, 16
// and 8, and every token alone still gives its row's bits.
TEST(Exl3MoeCuda, FortyTokensInPiecesEachAsAlone) {
  SPW_REQUIRE_GPU();
  run_case(1024, 512, 24, 3, Exl3Codebook::kMul1, 40, 6, 10.f, false, 14, true, 16);
}

// 64 tokens on 8 experts: each expert has ~48 pairs, so the kernel decodes it for groups of 8 pairs (6 a phase),
// and every token alone (in groups of one) still gives its row's bits.
TEST(Exl3MoeCuda, SixtyFourTokensOnFewExpertsEachAsAlone) {
  SPW_REQUIRE_GPU();
  run_case(1024, 512, 8, 3, Exl3Codebook::kMul1, 64, 6, 10.f, false, 15, true);
  run_case(512, 256, 8, 2, Exl3Codebook::k3Inst, 64, 6, 7.f, true, 16, false);
}

TEST(Exl3MoeCuda, RejectsUnsupported) {
  Exl3CudaMoeLayer layer;
  Exl3CudaExpert e;
  layer.experts = &e, layer.n_experts = 1, layer.d = 256, layer.f = 200, layer.bits.k_x2 = 6;
  EXPECT_FALSE(exl3_cuda_moe_supports(layer));  // f not a multiple of 128
  layer.f = 256, layer.bits.k_x2 = 5;
  EXPECT_FALSE(exl3_cuda_moe_supports(layer));  // K = 2.5
  layer.bits.k_x2 = 6;
  EXPECT_TRUE(exl3_cuda_moe_supports(layer));
  Exl3CudaMoeWorkspace ws;  // empty: too small for any call
  EXPECT_FALSE(exl3_moe_decode_cuda(layer, nullptr, nullptr, nullptr, 1, 6, nullptr, ws).ok());
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
