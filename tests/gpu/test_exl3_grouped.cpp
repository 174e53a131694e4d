// Grouped EXL3 GEMMs (cuda/exl3_grouped.h) against the per-expert path they replace: every expert's
// rows gathered on the host and run through exl3_gemm_cuda (itself tested against the fp64 reference
// in test_exl3_cuda.cpp). Experts get 0, 1, 7, 9, 16, 17, 64, 70, 100 and 130 rows, so all four row
// classes, the 96-row cut (100 → 50 + 50, 130 → 65 + 65) and an unused expert are covered; rows are
// gathered through a random x_rows and scattered through a random y_rows into a larger y (the rows
// nobody maps must stay zero). Every codebook, K = 2..4 and 6, with and without bias. The decode form
// (exl3_grouped_pairs_gemm_cuda: one item per (token, slot) pair, skipped slots) against the same.
// Tolerance: both paths add the same fp32 products, but in other groupings (the k slices differ: the
// per-expert launches split k for one matrix's parallelism, the grouped ones barely): |Δ| ≤
// 1e-5·max(|y|, RMS of y). With bf16 rounding such a
// difference can flip a rounding: one bf16 ulp more, and ≥ 95 % of the values bit-identical (98.4 %
// measured on the H200; near-zero outputs, sums of cancelling terms, flip most).
// Determinism at shapes with several k slices (d = 4096: 4 slices of the pairs' class, 8 of the 64-row
// class): a second call gives the same bits, and a pair computed among 16 tokens the same bits as alone.
// Built into spw_gpu_tests (not run by ctest); scripts/gpu_test.sh runs it on the GPU machine.
#if defined(SPW_HAVE_CUDA)
#include "cuda/exl3_gemm.h"
#include "cuda/exl3_grouped.h"
#include "gpu_test_util.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace spw {
namespace {

using gpu_test::upload;

TEST(Exl3Grouped, PlanCutsExpertsIntoEqualPiecesByClass) {
  // Experts with 0, 5, 8, 9, 16, 17, 64, 65, 130 rows.
  const std::vector<int32_t> counts = {0, 5, 8, 9, 16, 17, 64, 65, 130};
  std::vector<int32_t> first(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) first[e + 1] = first[e] + counts[e];
  const Exl3GroupPlan p = exl3_group_plan(first);
  EXPECT_EQ(p.n[0], 2);  // 5, 8
  EXPECT_EQ(p.n[1], 2);  // 9, 16
  EXPECT_EQ(p.n[2], 2);  // 17, 64
  EXPECT_EQ(p.n[3], 3);  // 65, 65 + 65
  ASSERT_EQ(int(p.items.size()), p.n[0] + p.n[1] + p.n[2] + p.n[3]);
  std::vector<int32_t> covered(first.back(), 0);
  for (int i = 0; i < int(p.items.size()); ++i) {
    const Exl3GroupItem& it = p.items[i];
    const int cls = i < p.n[0] ? 0 : i < p.n[0] + p.n[1] ? 1 : i < p.n[0] + p.n[1] + p.n[2] ? 2 : 3;
    const int hi[] = {8, 16, 64, 96}, lo[] = {0, 8, 16, 64};
    EXPECT_LE(it.m, hi[cls]) << "item " << i;
    EXPECT_GT(it.m, lo[cls]) << "item " << i;
    EXPECT_GE(it.row0, first[it.expert]);
    EXPECT_LE(it.row0 + it.m, first[it.expert + 1]);
    for (int r = 0; r < it.m; ++r) ++covered[it.row0 + r];
  }
  for (int32_t c : covered) EXPECT_EQ(c, 1);  // every row in exactly one item
  // The 130-row expert: 65 + 65, never 96 + 34.
  for (const Exl3GroupItem& it : p.items) {
    if (it.expert == 8) {
      EXPECT_EQ(it.m, 65);
    }
  }
}

std::vector<uint16_t> random_tensor(Exl3Tensor& t, int64_t k, int64_t n, int K, Exl3Codebook cb, bool bias,
                                    std::mt19937& rng) {
  std::normal_distribution<float> nd(0, 1);
  std::vector<uint16_t> trellis(size_t(k / 16) * (n / 16) * 16 * K);
  for (auto& w : trellis) w = rng() & 0xffff;
  t.k = k, t.n = n, t.bits.k_x2 = 2 * K, t.codebook = cb;
  t.suh.resize(k), t.svh.resize(n);
  for (auto& v : t.suh) v = exl3_f64_to_f16(0.03 * nd(rng));
  for (auto& v : t.svh) v = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * (1 + 0.2 * nd(rng)));
  t.bias.clear();
  if (bias) {
    t.bias.resize(n);
    for (auto& v : t.bias) v = exl3_f64_to_f16(0.1 * nd(rng));
  }
  return trellis;
}

float bf16_ulp(float v) {
  if (v == 0.f) return 0.f;
  int e = 0;
  std::frexp(v, &e);
  return std::ldexp(1.0f, e - 8);
}

// E random experts [e][w1, w3, w2] (d → f → d) on the device, their table and the layer over it.
struct RandomLayer {
  std::vector<Exl3CudaTensor> dev;  // [e·3 + q]
  Exl3CudaMoeLayer layer;
  std::vector<void*> owned;
  RandomLayer(int E, int64_t d, int64_t f, int K, Exl3Codebook cb, bool bias, std::mt19937& rng) : dev(E * 3) {
    std::vector<Exl3CudaExpert> table(E);
    for (int e = 0; e < E; ++e)
      for (int q = 0; q < 3; ++q) {
        const int i = e * 3 + q;
        Exl3Tensor host;
        const std::vector<uint16_t> trellis = random_tensor(host, q < 2 ? d : f, q < 2 ? f : d, K, cb, bias, rng);
        dev[i].trellis = upload(trellis), dev[i].suh = upload(host.suh), dev[i].svh = upload(host.svh);
        dev[i].bias = bias ? upload(host.bias) : nullptr;
        dev[i].k = host.k, dev[i].n = host.n, dev[i].bits = host.bits, dev[i].codebook = cb;
        table[e].trellis[q] = dev[i].trellis, table[e].suh[q] = dev[i].suh, table[e].svh[q] = dev[i].svh;
        table[e].bias[q] = dev[i].bias;
        owned.insert(owned.end(), {(void*)dev[i].trellis, (void*)dev[i].suh, (void*)dev[i].svh, (void*)dev[i].bias});
      }
    layer.experts = upload(table), layer.n_experts = E, layer.d = d, layer.f = f;
    layer.bits.k_x2 = 2 * K, layer.codebook = cb;
    owned.push_back((void*)layer.experts);
  }
  ~RandomLayer() {
    for (void* p : owned) cudaFree(p);
  }
};

// got against want (rows × n, mapped[row] false: must be exactly zero), with the tolerance at the top.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::vector<bool>& mapped,
                  int64_t n, bool round) {
  double ss = 0;
  int64_t n_mapped = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (mapped[i / n]) ss += double(want[i]) * want[i], ++n_mapped;
  const double rms = std::sqrt(ss / double(std::max<int64_t>(1, n_mapped)));
  ASSERT_GT(rms, 0.0);
  int64_t identical = 0, far = 0, first_far = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "output " << i;
    if (!mapped[i / n]) {  // rows nobody maps: the call's zeroes, untouched
      EXPECT_EQ(got[i], 0.f) << "unmapped y row " << i / n;
      continue;
    }
    if (got[i] == want[i]) {
      ++identical;
      continue;
    }
    const float tol = float(1e-5 * std::max<double>(std::fabs(want[i]), rms)) +
                      (round ? bf16_ulp(std::max(std::fabs(want[i]), std::fabs(got[i]))) : 0.f);
    if (std::fabs(got[i] - want[i]) > tol) {
      ++far;
      if (first_far < 0) first_far = int64_t(i);
    }
  }
  EXPECT_EQ(far, 0) << "first at " << first_far << " (row " << first_far / n << "): grouped "
                    << got[std::max<int64_t>(0, first_far)] << ", per expert " << want[std::max<int64_t>(0, first_far)];
  if (round) {
    EXPECT_GE(double(identical) / double(std::max<int64_t>(1, n_mapped)), 0.95);
  }
}

void grouped_vs_per_expert(int K, Exl3Codebook cb, bool bias, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "K=" << K << " cb=" << exl3_codebook_name(cb) << " bias=" << bias);
  SPW_REQUIRE_GPU();
  const int64_t d = 256, f = 384;
  const std::vector<int32_t> counts = {1, 0, 7, 9, 16, 17, 64, 70, 100, 130};
  const int E = int(counts.size());
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  RandomLayer rl(E, d, f, K, cb, bias, rng);
  const Exl3CudaMoeLayer& layer = rl.layer;
  const std::vector<Exl3CudaTensor>& dev = rl.dev;

  // Sorted rows: expert e owns first[e] .. first[e + 1]; each gathers source rows through x_rows and
  // lands at y_rows in a y with 5 extra rows nobody maps.
  std::vector<int32_t> first(E + 1, 0);
  for (int e = 0; e < E; ++e) first[e + 1] = first[e] + counts[e];
  const int64_t P = first[E], n_src = 420, y_total = P + 5;  // n_src ≥ P: w2 reads P rows of xsrc
  std::vector<int32_t> row_expert(P), x_rows(P), y_rows(y_total);
  for (int e = 0; e < E; ++e)
    for (int r = first[e]; r < first[e + 1]; ++r) row_expert[r] = e;
  for (auto& r : x_rows) r = int32_t(rng() % n_src);
  std::iota(y_rows.begin(), y_rows.end(), 0);
  std::shuffle(y_rows.begin(), y_rows.end(), rng);
  const Exl3GroupPlan plan = exl3_group_plan(first);

  std::vector<float> xsrc(n_src * std::max(d, f));
  for (auto& v : xsrc) v = nd(rng);
  float* dxsrc = upload(xsrc);
  int32_t* d_row_expert = upload(row_expert);
  int32_t* d_x_rows = upload(x_rows);
  int32_t* d_y_rows = upload(y_rows);
  Exl3GroupItem* d_items = upload(plan.items);
  void* xr = nullptr;
  float* dy = nullptr;
  uint32_t* counters = nullptr;
  ASSERT_EQ(cudaMalloc(&xr, sizeof(uint16_t) * P * std::max(d, f)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, sizeof(float) * y_total * std::max(d, f)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&counters, sizeof(uint32_t) * plan.items.size() * (std::max(d, f) / 128)), cudaSuccess);
  ASSERT_EQ(cudaMemset(counters, 0xff, sizeof(uint32_t) * plan.items.size() * (std::max(d, f) / 128)), cudaSuccess);
  Exl3CudaWorkspace ws;
  ASSERT_TRUE(exl3_cuda_workspace_alloc(ws, std::max(d, f), std::max(d, f)).ok());
  float *dxe = nullptr, *dye = nullptr;
  ASSERT_EQ(cudaMalloc(&dxe, sizeof(float) * 130 * std::max(d, f)), cudaSuccess);  // the largest expert
  ASSERT_EQ(cudaMalloc(&dye, sizeof(float) * 130 * std::max(d, f)), cudaSuccess);

  // w1 and w3 gather their rows from xsrc [n_src][d]; w2 reads xsrc [P][f] in sorted order (no gather),
  // as the engine's down projection reads h. All three scatter through y_rows (the engine does so for w2:
  // its outputs go to the (token, slot) order of the combine).
  for (int proj = 0; proj < 3; ++proj)
    for (bool round : {false, true}) {
      SCOPED_TRACE(testing::Message() << "proj=" << proj << " round=" << round);
      const int64_t k = proj == 2 ? f : d, n = proj == 2 ? d : f;
      const bool gather = proj != 2;
      ASSERT_TRUE(exl3_rotate_grouped_cuda(layer, proj, dxsrc, gather ? d_x_rows : nullptr, 1, d_row_expert, P, xr, nullptr).ok());
      auto st = exl3_grouped_gemm_cuda(layer, proj, plan, d_items, xr, dy, d_y_rows, y_total, counters, round, nullptr);
      ASSERT_TRUE(st.ok()) << st.error().message;
      std::vector<float> got(y_total * n);
      ASSERT_EQ(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);

      std::vector<float> want(y_total * n, 0.f);
      for (int e = 0; e < E; ++e) {
        const int m = counts[e];
        if (m == 0) continue;
        std::vector<float> xe(m * k);
        for (int r = 0; r < m; ++r) {
          const int64_t src = gather ? x_rows[first[e] + r] : first[e] + r;
          std::copy_n(xsrc.begin() + src * k, k, xe.begin() + r * k);
        }
        ASSERT_EQ(cudaMemcpy(dxe, xe.data(), xe.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_TRUE(exl3_gemm_cuda(dev[e * 3 + proj], dxe, m, dye, ws, nullptr, Exl3GemmPath::kAuto, round).ok());
        std::vector<float> ye(m * n);
        ASSERT_EQ(cudaMemcpy(ye.data(), dye, ye.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int r = 0; r < m; ++r) std::copy_n(ye.begin() + r * n, n, want.begin() + int64_t(y_rows[first[e] + r]) * n);
      }
      std::vector<bool> mapped(y_total, false);
      for (int64_t r = 0; r < P; ++r) mapped[y_rows[r]] = true;
      expect_close(got, want, mapped, n, round);
    }
  exl3_cuda_workspace_free(ws);
  for (void* p : {(void*)dxsrc, (void*)d_row_expert, (void*)d_x_rows, (void*)d_y_rows, (void*)d_items, xr, (void*)dy,
                  (void*)counters, (void*)dxe, (void*)dye})
    cudaFree(p);
}

TEST(Exl3Grouped, MatchesPerExpertK3Mul1) { grouped_vs_per_expert(3, Exl3Codebook::kMul1, false, 11); }
TEST(Exl3Grouped, MatchesPerExpertK2McgBias) { grouped_vs_per_expert(2, Exl3Codebook::kMcg, true, 12); }
TEST(Exl3Grouped, MatchesPerExpertK4ThreeInst) { grouped_vs_per_expert(4, Exl3Codebook::k3Inst, false, 13); }
TEST(Exl3Grouped, MatchesPerExpertK6Mul1Bias) { grouped_vs_per_expert(6, Exl3Codebook::kMul1, true, 14); }

// Decode steps: one item per (token, slot) pair, T tokens × top_k slots, some slots −1 (held elsewhere):
// pair p's row is token p / top_k's row through its expert (w1, w3), or row p of the input (w2).
void pairs_vs_per_expert(int T, int K, Exl3Codebook cb, bool bias, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << T << " K=" << K << " cb=" << exl3_codebook_name(cb) << " bias=" << bias);
  SPW_REQUIRE_GPU();
  const int64_t d = 256, f = 384, W = std::max(d, f);
  const int E = 8, topk = 4, P = T * topk;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  RandomLayer rl(E, d, f, K, cb, bias, rng);
  std::vector<int32_t> idx(P);
  for (int t = 0; t < T; ++t) {  // distinct experts per token; every fifth slot skipped
    std::vector<int32_t> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < topk; ++j) idx[t * topk + j] = (t * topk + j) % 5 == 3 ? -1 : perm[j];
  }
  std::vector<float> xsrc(P * W);
  for (auto& v : xsrc) v = nd(rng);
  float* dx = upload(xsrc);
  int32_t* didx = upload(idx);
  void* xr = nullptr;
  float *dy = nullptr, *dxe = nullptr, *dye = nullptr;
  uint32_t* counters = nullptr;
  ASSERT_EQ(cudaMalloc(&xr, sizeof(uint16_t) * P * W), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, sizeof(float) * P * W), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&counters, sizeof(uint32_t) * P * (W / 128)), cudaSuccess);
  ASSERT_EQ(cudaMemset(counters, 0xff, sizeof(uint32_t) * P * (W / 128)), cudaSuccess);  // the call zeroes them
  ASSERT_EQ(cudaMalloc(&dxe, sizeof(float) * W), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dye, sizeof(float) * W), cudaSuccess);
  Exl3CudaWorkspace ws;
  ASSERT_TRUE(exl3_cuda_workspace_alloc(ws, W, W).ok());
  for (int proj = 0; proj < 3; ++proj)
    for (bool round : {false, true}) {
      SCOPED_TRACE(testing::Message() << "proj=" << proj << " round=" << round);
      const int64_t k = proj == 2 ? f : d, n = proj == 2 ? d : f;
      const int x_div = proj == 2 ? 1 : topk;
      ASSERT_TRUE(exl3_rotate_grouped_cuda(rl.layer, proj, dx, nullptr, x_div, didx, P, xr, nullptr).ok());
      auto st = exl3_grouped_pairs_gemm_cuda(rl.layer, proj, didx, P, xr, dy, counters, round, nullptr);
      ASSERT_TRUE(st.ok()) << st.error().message;
      std::vector<float> got(P * n), want(P * n, 0.f);
      ASSERT_EQ(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      std::vector<bool> mapped(P, false);
      for (int p = 0; p < P; ++p) {
        if (idx[p] < 0) continue;
        mapped[p] = true;
        ASSERT_EQ(cudaMemcpy(dxe, xsrc.data() + int64_t(p / x_div) * k, k * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_TRUE(exl3_gemm_cuda(rl.dev[idx[p] * 3 + proj], dxe, 1, dye, ws, nullptr, Exl3GemmPath::kAuto, round).ok());
        ASSERT_EQ(cudaMemcpy(want.data() + int64_t(p) * n, dye, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      }
      expect_close(got, want, mapped, n, round);
    }
  exl3_cuda_workspace_free(ws);
  for (void* p : {(void*)dx, (void*)didx, xr, (void*)dy, (void*)counters, (void*)dxe, (void*)dye}) cudaFree(p);
}

TEST(Exl3Grouped, PairsMatchPerExpertT1) { pairs_vs_per_expert(1, 3, Exl3Codebook::kMul1, false, 21); }
TEST(Exl3Grouped, PairsMatchPerExpertT5Bias) { pairs_vs_per_expert(5, 3, Exl3Codebook::kMul1, true, 22); }
TEST(Exl3Grouped, PairsMatchPerExpertT16K2Mcg) { pairs_vs_per_expert(16, 2, Exl3Codebook::kMcg, false, 23); }

TEST(Exl3Grouped, RejectsUnsupportedLayers) {
  Exl3CudaMoeLayer layer;  // no table
  Exl3GroupPlan plan;
  EXPECT_FALSE(exl3_grouped_gemm_cuda(layer, 0, plan, nullptr, nullptr, nullptr, nullptr, 0, nullptr, false, nullptr).ok());
  layer.experts = reinterpret_cast<const Exl3CudaExpert*>(16), layer.n_experts = 1, layer.d = 256, layer.f = 384;
  layer.bits.k_x2 = 6;
  EXPECT_FALSE(exl3_rotate_grouped_cuda(layer, 3, nullptr, nullptr, 1, nullptr, 1, nullptr, nullptr).ok());  // no projection 3
  layer.f = 200;  // not a multiple of 128
  EXPECT_FALSE(exl3_grouped_gemm_cuda(layer, 0, plan, nullptr, nullptr, nullptr, nullptr, 0, nullptr, false, nullptr).ok());
}


// Bits of y [rows][n] from the device.
std::vector<float> fetch(const float* dy, int64_t count) {
  std::vector<float> h(count);
  EXPECT_EQ(cudaMemcpy(h.data(), dy, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << what << ": element " << i << " " << got[i] << " vs " << want[i];
}

// A fixed class puts every item in it, each expert's rows cut into equal pieces of at most the class's rows.
TEST(Exl3Grouped, PlanWithAFixedClass) {
  const std::vector<int32_t> counts = {0, 5, 8, 9, 16, 17, 64, 65, 130};
  std::vector<int32_t> first(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) first[e + 1] = first[e] + counts[e];
  for (int cls = 0; cls < kExl3GroupClasses; ++cls) {
    const Exl3GroupPlan p = exl3_group_plan(first, cls);
    int items = 0;
    for (int32_t m : counts) items += (m + kExl3ClassRows[cls] - 1) / kExl3ClassRows[cls];
    for (int c = 0; c < kExl3GroupClasses; ++c) EXPECT_EQ(p.n[c], c == cls ? items : 0) << "class " << cls;
    ASSERT_EQ(int(p.items.size()), items);
    std::vector<int32_t> covered(first.back(), 0);
    for (const Exl3GroupItem& it : p.items) {
      EXPECT_LE(it.m, kExl3ClassRows[cls]);
      const int32_t m = counts[it.expert], pieces = (m + kExl3ClassRows[cls] - 1) / kExl3ClassRows[cls];
      EXPECT_TRUE(it.m == m / pieces || it.m == m / pieces + 1) << "expert " << it.expert << ": unequal pieces";
      for (int r = 0; r < it.m; ++r) ++covered[it.row0 + r];
    }
    for (int32_t c : covered) EXPECT_EQ(c, 1);
  }
}

// Batch invariance of the host-dispatched items (MoePaths::exl3_fixed_classes): items of class 0 give every
// (token, slot) pair the bits of exl3_grouped_pairs_gemm_cuda (the device pairs a batch-invariant decode takes up
// to exl3_device_rows), and an item of class 2 gives a row the same bits whatever the item's other rows.
TEST(Exl3Grouped, FixedClassesKeepARowsBits) {
  SPW_REQUIRE_GPU();
  const int64_t d = 4096, f = 256;
  const int E = 6, topk = 6, T = 16, P = T * topk;
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0, 1);
  RandomLayer rl(E, d, f, 3, Exl3Codebook::kMul1, false, rng);
  std::vector<int32_t> idx(P);
  for (int p = 0; p < P; ++p) idx[p] = int32_t(rng() % E);
  std::vector<float> x(T * d);
  for (auto& v : x) v = nd(rng);
  float* dx = upload(x);
  int32_t* didx = upload(idx);
  void* xr = nullptr;
  float* dy = nullptr;
  uint32_t* counters = nullptr;
  ASSERT_EQ(cudaMalloc(&xr, sizeof(uint16_t) * P * d), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, sizeof(float) * P * d), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&counters, sizeof(uint32_t) * P * (d / 128)), cudaSuccess);
  std::vector<void*> frees = {dx, didx, xr, dy, counters};
  // The device pairs (w1, k = d: several k slices).
  ASSERT_TRUE(exl3_rotate_grouped_cuda(rl.layer, 0, dx, nullptr, topk, didx, P, xr, nullptr).ok());
  ASSERT_TRUE(exl3_grouped_pairs_gemm_cuda(rl.layer, 0, didx, P, xr, dy, counters, true, nullptr).ok());
  const std::vector<float> by_pairs = fetch(dy, int64_t(P) * f);
  // The same pairs sorted by expert into items of class 0, each row written back to its pair.
  std::vector<int32_t> first(E + 1, 0), x_rows, y_rows, row_expert;
  for (int e = 0; e < E; ++e) {
    for (int p = 0; p < P; ++p)
      if (idx[p] == e) x_rows.push_back(p / topk), y_rows.push_back(p), row_expert.push_back(e);
    first[e + 1] = int32_t(x_rows.size());
  }
  const Exl3GroupPlan plan0 = exl3_group_plan(first, 0);
  ASSERT_GT(plan0.items.size(), size_t(E)) << "some expert should take several class-0 items";
  Exl3GroupItem* items0 = upload(plan0.items);
  int32_t *d_x_rows = upload(x_rows), *d_y_rows = upload(y_rows), *d_row_expert = upload(row_expert);
  frees.insert(frees.end(), {items0, d_x_rows, d_y_rows, d_row_expert});
  ASSERT_TRUE(exl3_rotate_grouped_cuda(rl.layer, 0, dx, d_x_rows, 1, d_row_expert, P, xr, nullptr).ok());
  ASSERT_TRUE(exl3_grouped_gemm_cuda(rl.layer, 0, plan0, items0, xr, dy, d_y_rows, P, counters, true, nullptr).ok());
  expect_same_bits(fetch(dy, int64_t(P) * f), by_pairs, "class-0 items against the device pairs");
  // Class 2: one expert's 40 rows as one item, then each row as an item of its own.
  std::vector<int32_t> first40 = {0, 40}, expert0(40, 0);
  std::vector<float> xs(40 * d);
  for (auto& v : xs) v = nd(rng);
  float* dxs = upload(xs);
  int32_t* d_expert0 = upload(expert0);
  frees.insert(frees.end(), {dxs, d_expert0});
  auto class2 = [&](const std::vector<int32_t>& offsets, const float* rows, int n) {
    const Exl3GroupPlan plan = exl3_group_plan(offsets, 2);
    EXPECT_EQ(plan.n[2], int(plan.items.size()));
    Exl3GroupItem* items = upload(plan.items);
    EXPECT_TRUE(exl3_rotate_grouped_cuda(rl.layer, 0, rows, nullptr, 1, d_expert0, n, xr, nullptr).ok());
    auto st = exl3_grouped_gemm_cuda(rl.layer, 0, plan, items, xr, dy, nullptr, n, counters, true, nullptr);
    EXPECT_TRUE(st.ok()) << st.error().message;
    cudaFree(items);
    return fetch(dy, int64_t(n) * f);
  };
  const std::vector<float> together = class2(first40, dxs, 40);
  for (int r = 0; r < 40; r += 13) {
    const std::vector<float> alone = class2({0, 1}, dxs + int64_t(r) * d, 1);
    expect_same_bits(alone, std::vector<float>(together.begin() + int64_t(r) * f, together.begin() + int64_t(r + 1) * f),
                     "a row alone in a class-2 item against the same row among 40");
  }
  for (void* p : frees) cudaFree(p);
}

TEST(Exl3Grouped, DeterministicAndPairsIndependentOfTheBatch) {
  SPW_REQUIRE_GPU();
  const int64_t d = 4096, f = 256;
  const int E = 6, topk = 6, T = 16, P = T * topk;
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0, 1);
  RandomLayer rl(E, d, f, 3, Exl3Codebook::kMul1, false, rng);
  std::vector<int32_t> idx(P);
  for (int p = 0; p < P; ++p) idx[p] = p % 7 == 5 ? -1 : int32_t(rng() % E);
  std::vector<float> x(T * d);
  for (auto& v : x) v = nd(rng);
  float* dx = upload(x);
  int32_t* didx = upload(idx);
  void* xr = nullptr;
  float* dy = nullptr;
  uint32_t* counters = nullptr;
  ASSERT_EQ(cudaMalloc(&xr, sizeof(uint16_t) * P * d), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, sizeof(float) * P * d), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&counters, sizeof(uint32_t) * P * (d / 128)), cudaSuccess);
  // Pairs, w1 (k = d: four slices): twice, then each token alone.
  auto pairs = [&](const float* xt, const int32_t* it, int n_pairs) {
    EXPECT_TRUE(exl3_rotate_grouped_cuda(rl.layer, 0, xt, nullptr, topk, it, n_pairs, xr, nullptr).ok());
    auto st = exl3_grouped_pairs_gemm_cuda(rl.layer, 0, it, n_pairs, xr, dy, counters, true, nullptr);
    EXPECT_TRUE(st.ok()) << st.error().message;
    return fetch(dy, int64_t(n_pairs) * f);
  };
  const std::vector<float> batch = pairs(dx, didx, P);
  expect_same_bits(pairs(dx, didx, P), batch, "pairs, second call");
  for (int t = 0; t < T; ++t) {
    const std::vector<float> alone = pairs(dx + int64_t(t) * d, didx + t * topk, topk);
    expect_same_bits(alone, std::vector<float>(batch.begin() + int64_t(t) * topk * f, batch.begin() + int64_t(t + 1) * topk * f),
                     "a token alone against its rows in the batch");
  }
  // Items of the 64-row class (one expert, 64 rows; k = d: eight slices): twice.
  std::vector<int32_t> first(E + 1, 64);
  first[0] = 0;
  const Exl3GroupPlan plan = exl3_group_plan(first);
  ASSERT_EQ(plan.n[2], 1);
  Exl3GroupItem* items = upload(plan.items);
  std::vector<int32_t> row_expert(64, 0);
  int32_t* d_row_expert = upload(row_expert);
  std::vector<float> xs(64 * d);
  for (auto& v : xs) v = nd(rng);
  float* dxs = upload(xs);
  auto grouped = [&] {
    EXPECT_TRUE(exl3_rotate_grouped_cuda(rl.layer, 0, dxs, nullptr, 1, d_row_expert, 64, xr, nullptr).ok());
    auto st = exl3_grouped_gemm_cuda(rl.layer, 0, plan, items, xr, dy, nullptr, 64, counters, false, nullptr);
    EXPECT_TRUE(st.ok()) << st.error().message;
    return fetch(dy, 64 * f);
  };
  expect_same_bits(grouped(), grouped(), "64-row item, second call");
  for (void* p : {(void*)dx, (void*)didx, xr, (void*)dy, (void*)counters, (void*)items, (void*)d_row_expert, (void*)dxs})
    cudaFree(p);
}

}  // namespace
}  // namespace spw
#endif
