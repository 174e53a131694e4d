// Batched decode (GpuModel::decode, engine/gpu_model.h) against decoding each sequence alone with
// GpuModel::forward, on the golden tiny configs (tests/golden/fixtures/{v4,v41}), for B = 1, 3, 8
// sequences with different prompt lengths (so that their compressors emit entries at different
// steps and their indexers see different entry counts).
//
// B = 40 with decode's linears forced onto the GEMV (GpuModelOptions::decode_linear_path, sliced by 16 rows, 64 on tensor cores):
// the same exactness past 16 rows, which GpuRunner's batch invariance relies on.
// Each sequence is prefilled with forward() in both runs (the same calls, so the same KV state), then
// teacher-forced with the same pseudo-random decode tokens: alone, one forward() call per token;
// batched, one decode() call per step for all B sequences. Asserted, per sequence and step:
//  - the logits are bit-identical (memcmp). Why exact: every kernel of a step computes each row from
//    that row's own inputs (its slot, position, KV pages); the linears of ≤ 16 rows take the GEMV,
//    whose per-row result does not depend on the other rows (the property the golden chunked-prefill
//    test relies on); the MoE adds each token's experts in ascending expert order either way;
//  - next[i] is the argmax of those logits (lowest id among equal maxima).
// Device MoE dispatch (engine/moe_dispatch.h: grouped GEMVs over (token, slot) pairs) against the
// host dispatch (per-expert GEMV calls on gathered rows): the two sum each expert product in another
// order, so a bf16 rounding of an expert output may flip by one ulp; asserted: after layer 0 of a
// 16-token (V4 also 48-token) prefill, ≥ 99% of the residual-stream values within 2 bf16 ulps (a wrong expert, weight
// or quant block moves far more values), the share at every later layer printed.
// The fused EXL3 decode kernel in reference_rounding mode (what the engine runs for EXL3 experts at
// decode, cuda/exl3_moe.h) against the engine's per-expert EXL3 path (exl3_gemm_cuda per linear, bf16
// after each, cuda::swiglu with the route weight, sums in ascending expert order) on random experts:
// the kernel's projections meet by fp32 atomics, so a slot output's bf16 rounding may flip; asserted:
// ≥ 99% of the outputs within 2 bf16 ulps of the larger of the two sums or of the largest slot output
// (a flip moves the sum by one ulp of its term), and RMS error ≤ 1e-2·RMS (the unrounded mode's
// numbers are printed beside them).
// Plus decode()'s argument errors. Failures print arch, B, sequence, step and the first mismatch.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <cstdio>
#include <string>
#include <vector>

#include "../golden/golden_fixture.h"
#include "cuda/exl3_gemm.h"
#include "cuda/exl3_moe.h"
#include "cuda/ops/moe.h"
#include "cuda/ops/norm.h"
#include "engine/gpu_model.h"
#include "gpu_test_util.h"

namespace spw {
namespace {

constexpr int kDecodeSteps = 6;

std::unique_ptr<engine::GpuModel> load_gpu(const std::string& arch, int max_seqs,
                                           engine::MoeDispatch dispatch = engine::MoeDispatch::kAuto,
                                           LinearPath decode_path = LinearPath::kAuto) {
  engine::GpuModelOptions opts;
  opts.moe_dispatch = dispatch;
  opts.decode_linear_path = decode_path;
  opts.budget.max_context = 1024;
  opts.budget.max_seqs = max_seqs;
  auto m = engine::load_gpu_model(golden::fixture_dir(arch) + "/model", Numerics::reference(), opts);
  if (!m.ok()) ADD_FAILURE() << arch << ": " << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

std::vector<int32_t> tokens(int n, uint64_t seed, int vocab) { return gpu_test::lcg_tokens(n, seed, vocab); }

int32_t argmax(const float* v, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

// The first index where a and b differ bitwise (−1 if none), and max |a − b|.
int64_t first_mismatch(const float* a, const float* b, int64_t n, double& max_diff) {
  int64_t first = -1;
  max_diff = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && first < 0) first = i;
    max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
  }
  return first;
}

void batch_vs_alone(const std::string& arch, const std::vector<int>& prompt_lens,
                    LinearPath decode_path = LinearPath::kAuto) {
  SPW_REQUIRE_GPU();
  const int B = int(prompt_lens.size());
  auto gpu = load_gpu(arch, B, engine::MoeDispatch::kAuto, decode_path);
  ASSERT_TRUE(gpu);
  ASSERT_GE(gpu->invariant_decode_rows(), B) << arch << ": B = " << B << " is past the rows decode keeps independent";
  const int V = int(gpu->config().vocab_size);
  std::vector<std::vector<int32_t>> prompts(B), steps(B);
  for (int i = 0; i < B; ++i) {
    prompts[i] = tokens(prompt_lens[i], 11 + i, V);
    steps[i] = tokens(kDecodeSteps, 1000 + i, V);
  }

  // Alone: [B][steps][V].
  std::vector<std::vector<std::vector<float>>> alone(B);
  for (int i = 0; i < B; ++i) {
    auto seq = gpu->new_sequence();
    ASSERT_TRUE(seq.ok()) << seq.error().message;
    auto pre = gpu->forward(*seq, prompts[i]);
    ASSERT_TRUE(pre.ok()) << arch << " alone prefill " << i << ": " << pre.error().message;
    for (int t = 0; t < kDecodeSteps; ++t) {
      auto r = gpu->forward(*seq, std::span<const int32_t>(&steps[i][t], 1));
      ASSERT_TRUE(r.ok()) << arch << " alone seq " << i << " step " << t << ": " << r.error().message;
      ASSERT_EQ(r->size(), size_t(V));
      alone[i].push_back(std::move(r.value()));
    }
  }

  // Batched: the same prefills, then one decode() per step.
  std::vector<engine::GpuSequence> seqs;
  for (int i = 0; i < B; ++i) {
    auto seq = gpu->new_sequence();
    ASSERT_TRUE(seq.ok()) << seq.error().message;
    seqs.push_back(std::move(seq.value()));
    auto pre = gpu->forward(seqs.back(), prompts[i]);
    ASSERT_TRUE(pre.ok()) << arch << " batched prefill " << i << ": " << pre.error().message;
  }
  std::vector<engine::GpuSequence*> ptrs;
  for (auto& s : seqs) ptrs.push_back(&s);
  int n_identical = 0;
  for (int t = 0; t < kDecodeSteps; ++t) {
    std::vector<int32_t> in(B), next(B, -1);
    for (int i = 0; i < B; ++i) in[i] = steps[i][t];
    std::vector<float> logits;
    Status st = gpu->decode(ptrs, in, next, &logits);
    ASSERT_TRUE(st.ok()) << arch << " B=" << B << " step " << t << ": " << st.error().message;
    ASSERT_EQ(logits.size(), size_t(B) * V);
    for (int i = 0; i < B; ++i) {
      const float* got = logits.data() + size_t(i) * V;
      double max_diff = 0;
      const int64_t m = first_mismatch(got, alone[i][t].data(), V, max_diff);
      EXPECT_EQ(m, -1) << arch << " B=" << B << " seq " << i << " (prompt " << prompt_lens[i] << ") step " << t
                       << ": first mismatch at logit " << m << " (batched "
                       << (m >= 0 ? got[m] : 0.f) << ", alone " << (m >= 0 ? alone[i][t][m] : 0.f)
                       << "), max |diff| " << max_diff;
      if (m == -1) ++n_identical;
      EXPECT_EQ(next[i], argmax(got, V)) << arch << " B=" << B << " seq " << i << " step " << t;
      for (int v = 0; v < V; ++v)
        if (!std::isfinite(got[v])) {
          ADD_FAILURE() << arch << " B=" << B << " seq " << i << " step " << t << ": non-finite logit at " << v;
          break;
        }
    }
  }
  std::printf("  [batch %s B=%d] %d/%d (sequence, step) logit rows bit-identical to forward() alone; step arena "
              "high water %zu of %zu B\n", arch.c_str(), B, n_identical, B * kDecodeSteps, gpu->step_arena_high_water(),
              gpu->step_arena_capacity());
}

TEST(EngineBatch, V4DecodeB1MatchesForward) { batch_vs_alone("v4", {5}); }
TEST(EngineBatch, V41DecodeB1MatchesForward) { batch_vs_alone("v41", {5}); }
TEST(EngineBatch, V4DecodeB3MatchesAlone) { batch_vs_alone("v4", {2, 17, 63}); }
TEST(EngineBatch, V41DecodeB3MatchesAlone) { batch_vs_alone("v41", {2, 17, 63}); }
TEST(EngineBatch, V4DecodeB8MatchesAlone) { batch_vs_alone("v4", {1, 3, 7, 16, 31, 64, 127, 130}); }
TEST(EngineBatch, V41DecodeB8MatchesAlone) { batch_vs_alone("v41", {1, 3, 7, 16, 31, 64, 127, 130}); }
// Past 16 rows with decode's linears on the GEMV (in slices of 16) and the dense experts dispatched on the
// device (up to 64 rows): still every row from its own inputs (GpuRunner's batch invariance past 16).
std::vector<int> lens_b40() {
  std::vector<int> v;
  for (int i = 0; i < 40; ++i) v.push_back(1 + (i * 37) % 131);
  return v;
}
TEST(EngineBatch, V4DecodeB40GemvMatchesAlone) { batch_vs_alone("v4", lens_b40(), LinearPath::kGemv); }
TEST(EngineBatch, V41DecodeB40GemvMatchesAlone) { batch_vs_alone("v41", lens_b40(), LinearPath::kGemv); }

// One bf16 ulp at magnitude m > 0.
float bf16_ulp(float m) {
  if (m == 0.f) return 0.f;
  int e = 0;
  std::frexp(m, &e);
  return std::ldexp(1.0f, e - 8);
}

// Whether a and b are within two bf16 ulps of the larger magnitude.
bool within_2_bf16_ulps(float a, float b) {
  const float m = std::max(std::fabs(a), std::fabs(b));
  if (m == 0.f) return true;
  int e = 0;
  std::frexp(m, &e);  // m = f·2^e, f ∈ [0.5, 1): one bf16 ulp is 2^(e−8)
  return std::fabs(a - b) <= std::ldexp(1.0f, e - 7);
}

void device_vs_host_moe(const std::string& arch, int prompt_len = 16) {
  SPW_REQUIRE_GPU();
  auto host = load_gpu(arch, 1, engine::MoeDispatch::kHost);
  auto dev = load_gpu(arch, 1, engine::MoeDispatch::kDevice);
  ASSERT_TRUE(host && dev);
  const std::vector<int32_t> prompt = tokens(prompt_len, 7, int(host->config().vocab_size));
  std::vector<std::vector<float>> layers_host, layers_dev;
  ForwardOptions oh, od;
  oh.on_layer = [&](int, const std::vector<float>& x) { layers_host.push_back(x); };
  od.on_layer = [&](int, const std::vector<float>& x) { layers_dev.push_back(x); };
  auto sh = host->new_sequence();
  auto sd = dev->new_sequence();
  ASSERT_TRUE(sh.ok() && sd.ok());
  auto rh = host->forward(*sh, prompt, oh);
  auto rd = dev->forward(*sd, prompt, od);
  ASSERT_TRUE(rh.ok()) << rh.error().message;
  ASSERT_TRUE(rd.ok()) << rd.error().message;
  ASSERT_EQ(layers_host.size(), layers_dev.size());
  for (size_t l = 0; l < layers_host.size(); ++l) {
    ASSERT_EQ(layers_host[l].size(), layers_dev[l].size());
    size_t close = 0, first_far = SIZE_MAX;
    for (size_t i = 0; i < layers_host[l].size(); ++i) {
      if (within_2_bf16_ulps(layers_host[l][i], layers_dev[l][i])) ++close;
      else if (first_far == SIZE_MAX) first_far = i;
    }
    const double share = double(close) / double(layers_host[l].size());
    std::printf("  [moe dispatch %s, %d rows] layer %zu: %.4f of the streams within 2 bf16 ulps (device vs host)\n",
                arch.c_str(), prompt_len, l, share);
    if (l == 0) {
      EXPECT_GE(share, 0.99) << arch << " layer 0: first value beyond 2 bf16 ulps at " << first_far << " (host "
                             << layers_host[0][first_far] << ", device " << layers_dev[0][first_far] << ")";
    }
  }
}

TEST(EngineBatch, V4DeviceMoeMatchesHostDispatch) { device_vs_host_moe("v4"); }
// 48 rows: dense experts take the device dispatch up to kDeviceDispatchRowsDense = 64 rows (moe_dispatch.h).
TEST(EngineBatch, V4DeviceMoeMatchesHostDispatch48Rows) { device_vs_host_moe("v4", 48); }
TEST(EngineBatch, V41DeviceMoeMatchesHostDispatch) { device_vs_host_moe("v41"); }

Exl3Tensor random_exl3(std::vector<uint16_t>& trellis, int64_t k, int64_t n, int K, std::mt19937& rng) {
  std::normal_distribution<float> nd(0, 1);
  trellis.resize(size_t(k / 16) * (n / 16) * 16 * K);
  for (auto& w : trellis) w = rng() & 0xffff;
  Exl3Tensor t;
  t.k = k, t.n = n, t.bits.k_x2 = 2 * K, t.codebook = Exl3Codebook::kMul1, t.trellis = trellis.data();
  t.suh.resize(k), t.svh.resize(n);
  for (auto& v : t.suh) v = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * 0.5 / std::sqrt(double(k)) * (1 + 0.2 * nd(rng)));
  for (auto& v : t.svh) v = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * 3.0 * (1 + 0.2 * nd(rng)));
  return t;
}

void exl3_fused_vs_per_expert(int T) {
  SPW_REQUIRE_GPU();
  const int64_t d = 256, f = 384;
  const int E = 8, K = 4, topk = 4;
  const float limit = 7.f;
  std::mt19937 rng(1234 + T);
  std::normal_distribution<float> nd(0, 1);
  std::vector<std::vector<uint16_t>> trellis(E * 3);
  std::vector<Exl3Tensor> host(E * 3);  // [e][w1, w3, w2]
  std::vector<Exl3CudaTensor> dev(E * 3);
  std::vector<Exl3CudaExpert> table(E);
  std::vector<void*> owned;
  for (int e = 0; e < E; ++e)
    for (int q = 0; q < 3; ++q) {
      const int i = e * 3 + q;
      host[i] = random_exl3(trellis[i], q < 2 ? d : f, q < 2 ? f : d, K, rng);
      dev[i].trellis = gpu_test::upload(trellis[i]);
      dev[i].suh = gpu_test::upload(host[i].suh);
      dev[i].svh = gpu_test::upload(host[i].svh);
      dev[i].k = host[i].k, dev[i].n = host[i].n, dev[i].bits = host[i].bits, dev[i].codebook = host[i].codebook;
      table[e].trellis[q] = dev[i].trellis, table[e].suh[q] = dev[i].suh, table[e].svh[q] = dev[i].svh;
      owned.insert(owned.end(), {(void*)dev[i].trellis, (void*)dev[i].suh, (void*)dev[i].svh});
    }
  std::vector<float> x(T * d);
  for (auto& v : x) v = nd(rng);
  std::vector<int32_t> idx(T * topk);
  std::vector<float> w(T * topk);
  for (int t = 0; t < T; ++t) {  // distinct experts per token, in router (not id) order
    std::vector<int32_t> perm(E);
    for (int e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < topk; ++j) idx[t * topk + j] = perm[j], w[t * topk + j] = 0.1f + 0.9f * (rng() % 1000) / 1000.f;
  }
  float* dx = gpu_test::upload(x);
  int32_t* didx = gpu_test::upload(idx);
  float* dw = gpu_test::upload(w);
  float *g = nullptr, *u = nullptr, *h = nullptr, *yo = nullptr, *dy = nullptr;
  ASSERT_EQ(cudaMalloc(&g, f * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&u, f * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&h, f * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&yo, d * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, T * d * 4), cudaSuccess);
  Exl3CudaWorkspace ws;
  ASSERT_TRUE(exl3_cuda_workspace_alloc(ws, std::max(d, f), std::max(d, f)).ok());

  // Per-expert path, the engine's run_expert for one row, summed in ascending expert id.
  std::vector<float> ref(T * d, 0.f), y1(d), max_term(T * d, 0.f);
  for (int t = 0; t < T; ++t) {
    std::vector<int> order(topk);
    for (int j = 0; j < topk; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return idx[t * topk + a] < idx[t * topk + b]; });
    for (int j : order) {
      const int e = idx[t * topk + j];
      ASSERT_TRUE(exl3_gemm_cuda(dev[e * 3 + 0], dx + t * d, 1, g, ws).ok());
      ASSERT_TRUE(cuda::round_bf16(g, f, nullptr).ok());
      ASSERT_TRUE(exl3_gemm_cuda(dev[e * 3 + 1], dx + t * d, 1, u, ws).ok());
      ASSERT_TRUE(cuda::round_bf16(u, f, nullptr).ok());
      ASSERT_TRUE(cuda::swiglu(g, f, u, f, dw + t * topk + j, 1, f, limit, true, h, nullptr).ok());
      ASSERT_TRUE(exl3_gemm_cuda(dev[e * 3 + 2], h, 1, yo, ws).ok());
      ASSERT_TRUE(cuda::round_bf16(yo, d, nullptr).ok());
      ASSERT_EQ(cudaMemcpy(y1.data(), yo, d * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int i = 0; i < d; ++i) {
        ref[t * d + i] += y1[i];
        max_term[t * d + i] = std::max(max_term[t * d + i], std::fabs(y1[i]));
      }
    }
  }

  Exl3CudaMoeLayer layer;
  layer.experts = gpu_test::upload(table), layer.n_experts = E, layer.d = d, layer.f = f;
  layer.bits.k_x2 = 2 * K, layer.codebook = Exl3Codebook::kMul1, layer.swiglu_limit = limit;
  ASSERT_TRUE(exl3_cuda_moe_supports(layer));
  Exl3CudaMoeWorkspace mws;
  ASSERT_TRUE(exl3_cuda_moe_workspace_alloc(mws, T * topk, d, f).ok());
  for (bool rounding : {false, true}) {
    layer.reference_rounding = rounding;
    auto st = exl3_moe_decode_cuda(layer, dx, didx, dw, T, topk, dy, mws);
    ASSERT_TRUE(st.ok()) << st.error().message;
    std::vector<float> got(T * d);
    ASSERT_EQ(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t close = 0, first_far = SIZE_MAX;
    double rms = 0, e2 = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "T=" << T << " rounding=" << rounding << " output " << i;
      // A slot output that flips its bf16 rounding moves the sum by one ulp of that term.
      if (within_2_bf16_ulps(got[i], ref[i]) || std::fabs(got[i] - ref[i]) <= bf16_ulp(max_term[i]) * 2) ++close;
      else if (first_far == SIZE_MAX) first_far = i;
      rms += double(ref[i]) * ref[i], e2 += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    }
    rms = std::sqrt(rms / got.size());
    const double share = double(close) / got.size(), rel = std::sqrt(e2 / got.size()) / rms;
    std::printf("  [exl3 fused T=%d reference_rounding=%d] %.4f within 2 bf16 ulps of the per-expert path, "
                "RMS error %.2e of RMS\n", T, int(rounding), share, rel);
    if (rounding) {
      EXPECT_GE(share, 0.99) << "T=" << T << ": first output beyond 2 bf16 ulps at " << first_far << " (fused "
                             << got[first_far] << ", per-expert " << ref[first_far] << ")";
      EXPECT_LE(rel, 1e-2) << "T=" << T;
    }
  }
  exl3_cuda_moe_workspace_free(mws);
  exl3_cuda_workspace_free(ws);
  for (void* p : owned) cudaFree(p);
  for (void* p : {(void*)dx, (void*)didx, (void*)dw, (void*)g, (void*)u, (void*)h, (void*)yo, (void*)dy,
                  (void*)layer.experts})
    cudaFree(p);
}

TEST(EngineBatch, Exl3FusedReferenceRoundingMatchesPerExpertT1) { exl3_fused_vs_per_expert(1); }
TEST(EngineBatch, Exl3FusedReferenceRoundingMatchesPerExpertT3) { exl3_fused_vs_per_expert(3); }

TEST(EngineBatch, DecodeArgumentErrors) {
  SPW_REQUIRE_GPU();
  auto gpu = load_gpu("v4", 2);
  ASSERT_TRUE(gpu);
  auto a = gpu->new_sequence();
  ASSERT_TRUE(a.ok());
  std::vector<engine::GpuSequence*> twice = {&*a, &*a};
  std::vector<int32_t> in = {1, 2}, next(2);
  EXPECT_FALSE(gpu->decode(twice, in, next).ok()) << "a sequence twice in one step";
  std::vector<engine::GpuSequence*> one = {&*a};
  EXPECT_FALSE(gpu->decode(one, in, next).ok()) << "two tokens for one sequence";
  std::vector<int32_t> bad = {int32_t(gpu->config().vocab_size)};
  std::vector<int32_t> next1(1);
  EXPECT_FALSE(gpu->decode(one, bad, next1).ok()) << "token outside the vocabulary";
  EXPECT_EQ(a->n_past, 0) << "a failed step must not advance the sequence";
  std::vector<int32_t> good = {3};
  EXPECT_TRUE(gpu->decode(one, good, next1).ok());
  EXPECT_EQ(a->n_past, 1);
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
