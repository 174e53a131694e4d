// EXL3 x·W benchmark: HBM bandwidth (device copy and read-only), Spillway's CUDA kernel on the tensors
// of bench/exl3/make_bench_tensors.py (rotating through enough copies that no call hits L2), as a
// ratio to the roofline trellis_bytes / bandwidth, and the CPU kernel (spw_cpu) on the same tensors.
// Then the fused MoE decode kernel on one synthetic V4.1 layer (384 experts of 5120→2304→5120, K=3 mul1,
// random trellis), different random experts every call, against the roofline of the selected experts'
// trellis bytes, and against the same work done as 18·T separate exl3_gemm_cuda calls; that layer's expert
// GEMMs for 64..4096 tokens, grouped launches vs per-expert calls (the engine's host dispatch). Then prefill on the
// V4.1 expert shapes: decode-once + cuBLAS (exl3_prefill_cuda) vs the small-batch kernel in 16-token chunks
// vs a dense bf16 cuBLAS GEMM of the same shape, with the bf16 tensor-core rate of a large square GEMM.
// Usage: bench_exl3 DIR [iters] [gpu]   (DIR holds *.safetensors, one EXL3 linear each, prefix = file
// stem; "gpu" skips the CPU kernel rows)
// Driven by scripts/gpu_test.sh; results go to bench/results/exl3_h200.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../common/cuda_check.h"
#include "../common/hbm_read.cuh"
#include "cpu/exl3_gemm.h"
#include "cuda/exl3_gemm.h"
#include "cuda/exl3_grouped.h"
#include "cuda/exl3_moe.h"
#include "cuda/exl3_prefill.h"
#include "engine/expert_staging.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include "formats/exl3.h"
#include "formats/safetensors.h"

using namespace spw;


// µs per call of fn(i) (i = the call's index) over `reps` timed calls after `warmup` untimed ones: CUDA events
// around the timed calls, so launch overhead counts and nothing waits between calls.
template <class F>
static double us_per_call(F&& fn, int warmup, int reps, cudaEvent_t e0, cudaEvent_t e1) {
  for (int i = 0; i < warmup; ++i) fn(i);
  CK(cudaDeviceSynchronize());
  float ms;
  CK(cudaEventRecord(e0));
  for (int i = 0; i < reps; ++i) fn(i);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return ms * 1e3 / reps;
}

// One layer's three expert projections for T tokens with uniform random routing (distinct experts per
// token), as the engine's host dispatch runs them: grouped launches (cuda/exl3_grouped.h: rotation +
// one launch per row class and projection) vs three exl3_gemm_cuda calls per expert on its rows.
// Timing only (no SwiGLU between the projections, inputs of any content).
static void bench_grouped(const Exl3CudaMoeLayer& layer, const std::vector<Exl3CudaExpert>& table,
                          Exl3CudaWorkspace& gws, cudaEvent_t e0, cudaEvent_t e1) {
  const int E = layer.n_experts, topk = 6;
  const int64_t d = layer.d, f = layer.f, W = std::max(d, f);
  std::printf("\nOne layer's expert GEMMs under host dispatch (w1, w3, w2 of every routed expert; uniform random routing)\n");
  std::printf("| tokens | pairs | items (≤8 / ≤16 / ≤64 / ≤96 rows) | grouped ms | per-expert ms | speed-up |\n|---|---|---|---|---|---|\n");
  std::mt19937 rng(11);
  for (int T : {64, 512, 4096}) {
    const int64_t P = int64_t(T) * topk;
    std::vector<int32_t> count(E, 0), first(E + 1, 0);
    for (int t = 0; t < T; ++t) {
      std::vector<int32_t> perm(E);
      for (int e = 0; e < E; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int j = 0; j < topk; ++j) ++count[perm[j]];
    }
    for (int e = 0; e < E; ++e) first[e + 1] = first[e] + count[e];
    std::vector<int32_t> row_expert(P);
    for (int e = 0; e < E; ++e)
      for (int r = first[e]; r < first[e + 1]; ++r) row_expert[r] = e;
    const Exl3GroupPlan plan = exl3_group_plan(first);
    int32_t *d_re, *d_rows;
    Exl3GroupItem* d_items;
    void* xr;
    float *xin, *yout;
    uint32_t* counters;
    std::vector<int32_t> rows(P);
    for (int64_t r = 0; r < P; ++r) rows[r] = int32_t(r % T);
    CK(cudaMalloc(&d_re, P * 4));
    CK(cudaMalloc(&d_rows, P * 4));
    CK(cudaMalloc(&d_items, plan.items.size() * sizeof(Exl3GroupItem)));
    CK(cudaMalloc(&xr, P * W * 2));
    CK(cudaMalloc(&xin, P * W * 4));
    CK(cudaMalloc(&yout, P * W * 4));
    CK(cudaMalloc(&counters, plan.items.size() * (W / 128) * 4));
    CK(cudaMemset(xin, 0, P * W * 4));
    CK(cudaMemcpy(d_re, row_expert.data(), P * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_rows, rows.data(), P * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_items, plan.items.data(), plan.items.size() * sizeof(Exl3GroupItem), cudaMemcpyHostToDevice));
    auto grouped = [&](int) {
      for (int q = 0; q < 3; ++q) {
        Status st = exl3_rotate_grouped_cuda(layer, q, xin, q < 2 ? d_rows : nullptr, 1, d_re, P, xr, nullptr);
        if (st.ok()) st = exl3_grouped_gemm_cuda(layer, q, plan, d_items, xr, yout, nullptr, P, counters, true, nullptr);
        if (!st.ok()) { std::fprintf(stderr, "%s\n", st.error().message.c_str()); std::exit(1); }
      }
    };
    auto per_expert = [&](int) {
      for (int e = 0; e < E; ++e) {
        const int m = count[e];
        if (m == 0) continue;
        for (int q = 0; q < 3; ++q) {
          Exl3CudaTensor ct;
          ct.trellis = table[e].trellis[q], ct.suh = table[e].suh[q], ct.svh = table[e].svh[q];
          ct.k = q == 2 ? f : d, ct.n = q == 2 ? d : f, ct.bits = layer.bits, ct.codebook = layer.codebook;
          (void)exl3_gemm_cuda(ct, xin + int64_t(first[e]) * W, m, yout + int64_t(first[e]) * W, gws, nullptr,
                               Exl3GemmPath::kAuto, true);
        }
      }
    };
    const int reps = T >= 4096 ? 3 : 10;
    const double g_ms = us_per_call(grouped, 1, reps, e0, e1) * 1e-3, p_ms = us_per_call(per_expert, 1, reps, e0, e1) * 1e-3;
    std::printf("| %d | %lld | %d / %d / %d / %d | %.3f | %.3f | %.2f× |\n", T, (long long)P, plan.n[0], plan.n[1], plan.n[2], plan.n[3],
                g_ms, p_ms, p_ms / g_ms);
    for (void* p : {(void*)d_re, (void*)d_rows, (void*)d_items, xr, (void*)xin, (void*)yout, (void*)counters}) CK(cudaFree(p));
  }
}

// One synthetic V4.1 MoE layer: fused kernel vs roofline and vs separate GEMV calls.
// Where one fused MoE call's time goes: every warp stamps %globaltimer at the start and end of each phase
// (Exl3CudaMoeWorkspace::phase_ns); a phase's wall time is warp 0's view, from its stamp after the barrier that
// opens the phase to its stamp after the barrier that closes it (the last phase: to the last warp's end). Spans
// of single warps are not shown: they mix in values that cannot be right (µs-long spans of warps with no work in
// the phase), so only one SM's view of the barriers is used. Medians over 21 calls.
static void moe_phase_table(const Exl3CudaMoeLayer& layer, Exl3CudaMoeWorkspace& ws, const float* x, const int32_t* idx,
                            const float* w, float* y, int topk, int max_t, int n_sets) {
  const int64_t n = exl3_moe_phase_stamps(layer);
  if (n <= 0) return;
  constexpr int kS = 2 * kMoePhases;  // stamps per warp
  const int warps = static_cast<int>(n / kS);
  unsigned long long* dstamps;
  CK(cudaMalloc(&dstamps, n * sizeof(unsigned long long)));
  std::vector<unsigned long long> st(n);
  std::printf("\nFused MoE phases (%%globaltimer, warp 0's view of the barriers, %d warps; median of 21 calls; µs)\n", warps);
  std::printf("| tokens | A rotate | B gate/up | C SwiGLU | D down | E combine | sum |\n|---|---|---|---|---|---|---|\n");
  for (int T : {1, 8, 64}) {
    std::vector<std::array<double, kMoePhases>> runs;
    for (int r = 0; r < 21; ++r) {
      ws.phase_ns = dstamps;
      const int s = r % n_sets;
      auto ok = exl3_moe_decode_cuda(layer, x, idx + s * max_t * topk, w + s * max_t * topk, T, topk, y, ws);
      ws.phase_ns = nullptr;
      if (!ok.ok()) { std::fprintf(stderr, "%s\n", ok.error().message.c_str()); std::exit(1); }
      CK(cudaMemcpy(st.data(), dstamps, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      unsigned long long kernel_end = 0;
      for (int wi = 0; wi < warps; ++wi) kernel_end = std::max(kernel_end, st[wi * kS + kS - 1]);
      std::array<double, kMoePhases> v{};
      for (int ph = 0; ph < kMoePhases; ++ph) {
        const unsigned long long end = ph < kMoePhases - 1 ? st[2 * ph + 2] : kernel_end;
        v[ph] = (double(end) - double(st[2 * ph])) / 1e3;
      }
      runs.push_back(v);
    }
    std::printf("| %d |", T);
    double sum = 0;
    for (int ph = 0; ph < kMoePhases; ++ph) {
      std::vector<double> col;
      for (auto& v : runs) col.push_back(v[ph]);
      std::nth_element(col.begin(), col.begin() + col.size() / 2, col.end());
      sum += col[col.size() / 2];
      std::printf(" %.2f |", col[col.size() / 2]);
    }
    std::printf(" %.2f |\n", sum);
  }
  CK(cudaFree(dstamps));
}

// mapped: every expert's trellis in pinned host memory mapped into the device (the engine's HostGpu tier), read over
// PCIe by the same kernels; read_bw is then the mapped read rate, and the per-GEMV, phase and grouped tables are
// left out (they time the HBM case).
static void bench_moe(int iters, double read_bw, cudaEvent_t e0, cudaEvent_t e1, bool mapped = false) {
  const int E = 384, topk = 6, K = 3;
  const int64_t d = 5120, f = 2304;
  const Exl3Codebook cb = Exl3Codebook::kMul1;
  std::mt19937 rng(7);
  const size_t tb[3] = {size_t(d / 16) * (f / 16) * 16 * K * 2, size_t(d / 16) * (f / 16) * 16 * K * 2,
                        size_t(f / 16) * (d / 16) * 16 * K * 2};
  std::vector<uint16_t> host(tb[0] / 2);  // one random trellis image, copied to every expert (decode cost is data-independent)
  for (auto& v : host) v = rng() & 0xffff;
  std::vector<Exl3CudaExpert> table(E);
  std::vector<uint16_t> sv(std::max(d, f));
  char* pinned = nullptr;  // mapped: one allocation holding every trellis
  size_t pinned_at = 0;
  if (mapped) {
    CK(cudaHostAlloc(&pinned, size_t(E) * (tb[0] + tb[1] + tb[2]), cudaHostAllocMapped));
  }
  for (int q = 0; q < 3; ++q) {
    uint16_t *suh, *svh;  // shared scale vectors (their values do not change the timing)
    const int64_t k = q == 2 ? f : d, n = q == 2 ? d : f;
    for (int64_t i = 0; i < k; ++i) sv[i] = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * 0.01);
    CK(cudaMalloc(&suh, k * 2));
    CK(cudaMemcpy(suh, sv.data(), k * 2, cudaMemcpyHostToDevice));
    for (int64_t i = 0; i < n; ++i) sv[i] = exl3_f64_to_f16(((rng() & 1) ? 1 : -1) * 1.0);
    CK(cudaMalloc(&svh, n * 2));
    CK(cudaMemcpy(svh, sv.data(), n * 2, cudaMemcpyHostToDevice));
    for (int e = 0; e < E; ++e) {
      uint16_t* tr;
      if (mapped) {
        std::memcpy(pinned + pinned_at, host.data(), tb[q]);
        void* dev = nullptr;
        CK(cudaHostGetDevicePointer(&dev, pinned + pinned_at, 0));
        tr = static_cast<uint16_t*>(dev);
        pinned_at += tb[q];
      } else {
        CK(cudaMalloc(&tr, tb[q]));
        CK(cudaMemcpy(tr, host.data(), tb[q], cudaMemcpyHostToDevice));
      }
      table[e].trellis[q] = tr, table[e].suh[q] = suh, table[e].svh[q] = svh;
    }
  }
  Exl3CudaExpert* dtable;
  CK(cudaMalloc(&dtable, E * sizeof(Exl3CudaExpert)));
  CK(cudaMemcpy(dtable, table.data(), E * sizeof(Exl3CudaExpert), cudaMemcpyHostToDevice));
  Exl3CudaMoeLayer layer;
  layer.experts = dtable, layer.n_experts = E, layer.d = d, layer.f = f, layer.bits.k_x2 = 2 * K, layer.codebook = cb;
  layer.swiglu_limit = 10.f;
  const int max_t = 64, n_sets = 64;
  Exl3CudaMoeWorkspace ws;
  if (!exl3_cuda_moe_workspace_alloc(ws, max_t * topk, d, f).ok()) std::exit(1);
  Exl3CudaWorkspace gws;
  if (!exl3_cuda_workspace_alloc(gws, d, d).ok()) std::exit(1);
  float *x, *y, *w, *g, *u;
  int32_t* idx;
  CK(cudaMalloc(&x, max_t * d * 4));
  CK(cudaMalloc(&y, max_t * d * 4));
  CK(cudaMalloc(&g, f * 4));
  CK(cudaMalloc(&u, f * 4));
  CK(cudaMalloc(&w, n_sets * max_t * topk * 4));
  CK(cudaMalloc(&idx, n_sets * max_t * topk * 4));
  std::vector<float> xh(max_t * d), wh(n_sets * max_t * topk, 1.0f / topk);
  std::normal_distribution<float> nd;
  for (auto& v : xh) v = nd(rng);
  std::vector<int32_t> ih(n_sets * max_t * topk);
  for (int s = 0; s < n_sets; ++s)  // distinct experts within a token, random across tokens and calls
    for (int t = 0; t < max_t; ++t) {
      std::vector<int32_t> perm(E);
      for (int e = 0; e < E; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int j = 0; j < topk; ++j) ih[(s * max_t + t) * topk + j] = perm[j];
    }
  CK(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w, wh.data(), wh.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(idx, ih.data(), ih.size() * 4, cudaMemcpyHostToDevice));
  std::printf("\nFused MoE decode, one V4.1 layer (%d experts, d=%lld, f=%lld, K=%d %s, top-%d; random experts per call)%s\n",
              E, (long long)d, (long long)f, K, exl3_codebook_name(cb), topk,
              mapped ? ", every trellis in mapped pinned host memory (read over PCIe)" : "");
  std::printf("| tokens | distinct experts/call (mean) | fused µs | trellis GB/s | vs read-bw roofline | 18·T GEMV calls µs | grouped pairs µs |%s\n|---|---|---|---|---|---|---|%s\n",
              mapped ? " staging copy µs | staging copy GB/s | vs read-bw roofline | staged + fused µs |" : "",
              mapped ? "---|---|---|---|" : "");
  // mapped: what decode steps do (engine/expert_staging.h): copy the step's distinct experts into HBM slots with a
  // streaming kernel, then run the fused kernel on them. The copy is the part that reads the host.
  spw::engine::ExpertStaging staging;
  uint8_t* on_host = nullptr;
  if (mapped) {
    if (!spw::engine::expert_staging_alloc(staging, layer, E).ok()) std::exit(1);
    CK(cudaMalloc(&on_host, E));
    CK(cudaMemset(on_host, 1, E));
  }
  // The grouped decode form (the engine's default from 8 rows): rotations and one grouped launch per
  // projection with an item per (token, slot) pair; its SwiGLU and combine launches are not included.
  void* pxr;
  float *pg, *pu, *py;
  uint32_t* pcnt;
  CK(cudaMalloc(&pxr, max_t * topk * std::max(d, f) * 2));
  CK(cudaMalloc(&pg, max_t * topk * f * 4));
  CK(cudaMalloc(&pu, max_t * topk * f * 4));
  CK(cudaMalloc(&py, max_t * topk * d * 4));
  CK(cudaMalloc(&pcnt, max_t * topk * (std::max(d, f) / 128) * 4));
  for (int T : {1, 2, 4, 8, 16, 32, 64}) {
    double distinct = 0;
    for (int s = 0; s < n_sets; ++s) {
      std::vector<int32_t> v(ih.begin() + s * max_t * topk, ih.begin() + s * max_t * topk + T * topk);
      std::sort(v.begin(), v.end());
      distinct += std::unique(v.begin(), v.end()) - v.begin();
    }
    distinct /= n_sets;
    const double bytes = distinct * (tb[0] + tb[1] + tb[2]);
    auto call = [&](int i) {
      const int s = i % n_sets;
      auto st = exl3_moe_decode_cuda(layer, x, idx + s * max_t * topk, w + s * max_t * topk, T, topk, y, ws);
      if (!st.ok()) { std::fprintf(stderr, "%s\n", st.error().message.c_str()); std::exit(1); }
    };
    const double us = us_per_call(call, 10, iters, e0, e1);
    // The same projections as separate GEMV calls (no SwiGLU between: timing only).
    auto gemv = [&](int i) {
      const int s = i % n_sets;
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < topk; ++j) {
          const Exl3CudaExpert& ex = table[ih[(s * max_t + t) * topk + j]];
          for (int q = 0; q < 3; ++q) {
            Exl3CudaTensor ct;
            ct.trellis = ex.trellis[q], ct.suh = ex.suh[q], ct.svh = ex.svh[q], ct.k = q == 2 ? f : d, ct.n = q == 2 ? d : f;
            ct.bits = layer.bits, ct.codebook = cb;
            (void)exl3_gemm_cuda(ct, q == 2 ? g : x + t * d, 1, q == 0 ? g : q == 1 ? u : y + t * d, gws);
          }
        }
    };
    const bool time_gemv = !mapped && T <= 8;  // 18·T launches: past 8 tokens it only costs bench time
    const double gus = time_gemv ? us_per_call(gemv, 3, std::max(10, iters / 4), e0, e1) : 0.0;
    auto pairs = [&](int i) {
      const int s = i % n_sets;
      const int32_t* ids = idx + s * max_t * topk;
      const int P = T * topk;
      Status st = exl3_rotate_grouped_cuda(layer, 0, x, nullptr, topk, ids, P, pxr, nullptr);
      if (st.ok()) st = exl3_grouped_pairs_gemm_cuda(layer, 0, ids, P, pxr, pg, pcnt, true, nullptr);
      if (st.ok()) st = exl3_rotate_grouped_cuda(layer, 1, x, nullptr, topk, ids, P, pxr, nullptr);
      if (st.ok()) st = exl3_grouped_pairs_gemm_cuda(layer, 1, ids, P, pxr, pu, pcnt, true, nullptr);
      if (st.ok()) st = exl3_rotate_grouped_cuda(layer, 2, pg, nullptr, 1, ids, P, pxr, nullptr);
      if (st.ok()) st = exl3_grouped_pairs_gemm_cuda(layer, 2, ids, P, pxr, py, pcnt, true, nullptr);
      if (!st.ok()) { std::fprintf(stderr, "%s\n", st.error().message.c_str()); std::exit(1); }
    };
    const double pus = us_per_call(pairs, 10, iters, e0, e1);
    char gemv_col[32] = "not timed", staged_cols[160] = "";
    if (time_gemv) std::snprintf(gemv_col, sizeof gemv_col, "%.2f", gus);
    if (mapped) {
      spw::Exl3CudaMoeLayer staged;
      auto stage = [&](int i) {
        const int s = i % n_sets;
        if (!spw::engine::stage_host_experts_cuda(staging, layer, idx + s * max_t * topk, T * topk, on_host, staged, 0)
                 .ok())
          std::exit(1);
      };
      auto stage_and_run = [&](int i) {
        stage(i);
        const int s = i % n_sets;
        if (!exl3_moe_decode_cuda(staged, x, idx + s * max_t * topk, w + s * max_t * topk, T, topk, y, ws).ok())
          std::exit(1);
      };
      const double sus = us_per_call(stage, 10, iters, e0, e1);
      const double rus = us_per_call(stage_and_run, 10, iters, e0, e1);
      // Bytes the copy moves: the distinct experts up to the ring's slots (the rest stay mapped for the kernels).
      const double staged_bytes = std::min(distinct, double(spw::engine::kStagingSlots)) * (tb[0] + tb[1] + tb[2]);
      std::snprintf(staged_cols, sizeof staged_cols, " %.2f | %.1f | %.1f%% | %.2f |", sus,
                    staged_bytes / (sus * 1e-6) / 1e9, 100.0 * (staged_bytes / read_bw) / (sus * 1e-6), rus);
    }
    std::printf("| %d | %.1f | %.2f | %.0f | %.1f%% | %s | %.2f |%s\n", T, distinct, us, bytes / (us * 1e-6) / 1e9,
                100.0 * (bytes / read_bw) / (us * 1e-6), gemv_col, pus, staged_cols);
  }
  for (void* p : {pxr, (void*)pg, (void*)pu, (void*)py, (void*)pcnt}) CK(cudaFree(p));
  if (!mapped) {
    moe_phase_table(layer, ws, x, idx, w, y, topk, max_t, n_sets);
    bench_grouped(layer, table, gws, e0, e1);
  } else {
    CK(cudaFreeHost(pinned));
    CK(cudaFree(on_host));
  }
  exl3_cuda_moe_workspace_free(ws);
  exl3_cuda_workspace_free(gws);
}

// Prefill: tokens/s of one expert matrix at m tokens, three ways, and the dense bf16 tensor-core rate.
static void bench_prefill(cudaEvent_t e0, cudaEvent_t e1) {
  std::mt19937 rng(3);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { std::fprintf(stderr, "cublasCreate failed\n"); std::exit(1); }
  auto time_it = [&](int reps, auto&& fn) { return us_per_call([&](int) { fn(); }, 1, reps, e0, e1); };
  auto dense_gemm = [&](int64_t m, int64_t k, int64_t n, const void* w, const void* x, float* y) {
    const float one = 1.f, zero = 0.f;
    if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, w, CUDA_R_16BF, int(k), x, CUDA_R_16BF,
                     int(k), &zero, y, CUDA_R_32F, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed\n");
      std::exit(1);
    }
  };
  // The tensor-core rate in this call: a large square bf16 GEMM.
  {
    const int64_t s = 8192;
    void *w, *x;
    float* y;
    CK(cudaMalloc(&w, s * s * 2));
    CK(cudaMalloc(&x, s * s * 2));
    CK(cudaMalloc(&y, s * s * 4));
    CK(cudaMemset(w, 0, s * s * 2));
    CK(cudaMemset(x, 0, s * s * 2));
    const double us = time_it(10, [&] { dense_gemm(s, s, s, w, x, y); });
    std::printf("\nbf16 tensor-core rate (cuBLAS %lld³ GEMM, fp32 accumulate): %.0f TFLOP/s\n", (long long)s,
                2.0 * s * s * s / (us * 1e-6) / 1e12);
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  std::printf("\nPrefill, one expert matrix, K=3 mul1 (tokens/s; TFLOP/s on 2·m·k·n)\n");
  std::printf("| k×n | m | decode-once + cuBLAS µs | tok/s | TFLOP/s | kernel, 16-row launches µs | kernel, 64-row launches µs | tok/s | dense bf16 cuBLAS µs | tok/s | EXL3 best vs dense |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto [k, n] : {std::pair<int64_t, int64_t>{5120, 2304}, {2304, 5120}}) {
    const int K = 3;
    std::vector<uint16_t> tr(size_t(k / 16) * (n / 16) * 16 * K), sv(std::max(k, n));
    for (auto& v : tr) v = rng() & 0xffff;
    Exl3CudaTensor t;
    uint16_t *dtr, *suh, *svh;
    CK(cudaMalloc(&dtr, tr.size() * 2));
    CK(cudaMemcpy(dtr, tr.data(), tr.size() * 2, cudaMemcpyHostToDevice));
    for (auto& v : sv) v = exl3_f64_to_f16((rng() & 1) ? 0.01 : -0.01);
    CK(cudaMalloc(&suh, k * 2));
    CK(cudaMemcpy(suh, sv.data(), k * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&svh, n * 2));
    CK(cudaMemcpy(svh, sv.data(), n * 2, cudaMemcpyHostToDevice));
    t.trellis = dtr, t.suh = suh, t.svh = svh, t.k = k, t.n = n, t.bits.k_x2 = 2 * K, t.codebook = Exl3Codebook::kMul1;
    const int64_t max_m = 4096;
    float *x, *y;
    void *wd, *xd;
    CK(cudaMalloc(&x, max_m * k * 4));
    CK(cudaMalloc(&y, max_m * n * 4));
    CK(cudaMemset(x, 0, max_m * k * 4));
    CK(cudaMalloc(&wd, k * n * 2));
    CK(cudaMalloc(&xd, max_m * k * 2));
    CK(cudaMemset(wd, 0, k * n * 2));
    CK(cudaMemset(xd, 0, max_m * k * 2));
    Exl3PrefillWorkspace pws;
    Exl3CudaWorkspace gws;
    if (!exl3_prefill_workspace_alloc(pws, k, n, max_m).ok() || !exl3_cuda_workspace_alloc(gws, k, n).ok()) std::exit(1);
    for (int64_t m : {16, 32, 64, 128, 512, 4096}) {
      const double us_p = time_it(5, [&] { (void)exl3_prefill_cuda(t, x, m, y, pws); });
      gws.rows_per_launch = 16;  // the bulk kernel in 16-row launches (each tile decoded once per 16 rows)
      const double us_c = time_it(m >= 4096 ? 2 : 5, [&] { (void)exl3_gemm_cuda(t, x, m, y, gws, nullptr, Exl3GemmPath::kBulk); });
      gws.rows_per_launch = 0;   // 64-row launches (the default)
      const double us_c64 = time_it(m >= 4096 ? 2 : 5, [&] { (void)exl3_gemm_cuda(t, x, m, y, gws, nullptr, Exl3GemmPath::kBulk); });
      const double us_d = time_it(5, [&] { dense_gemm(m, k, n, wd, xd, y); });
      const double flop = 2.0 * m * k * n;
      const double best = std::min({us_p, us_c, us_c64});
      std::printf("| %lldx%lld | %lld | %.1f | %.0f | %.1f | %.1f | %.1f | %.0f | %.1f | %.0f | %.2f× |\n", (long long)k,
                  (long long)n, (long long)m, us_p, m / (us_p * 1e-6), flop / (us_p * 1e-6) / 1e12, us_c, us_c64,
                  m / (us_c64 * 1e-6), us_d, m / (us_d * 1e-6), us_d / best);
    }
    // The 64-row launch's k split (blocks_per_sm sets how many k slices share a column group: fewer slices,
    // fewer float4 atomics, but fewer blocks in flight).
    std::printf("|   (64-row launch at m=64 by k split:");
    for (int bps : {1, 2, 3, 4}) {
      gws.blocks_per_sm = bps;
      const double us = time_it(5, [&] { (void)exl3_gemm_cuda(t, x, 64, y, gws, nullptr, Exl3GemmPath::kBulk); });
      std::printf(" %d blocks/SM %.1f µs%s", bps, us, bps < 4 ? "," : ")");
    }
    std::printf(" | | | | | | | | | | |\n");
    gws.blocks_per_sm = 0;
    exl3_prefill_workspace_free(pws);
    exl3_cuda_workspace_free(gws);
    for (void* p : {(void*)dtr, (void*)suh, (void*)svh, (void*)x, (void*)y, wd, xd}) CK(cudaFree(p));
  }
  cublasDestroy(h);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_exl3 DIR [iters] [gpu] [moe]\n"
                         "  gpu: skip the CPU kernels; moe: only the fused MoE tables (DIR is not read)\n");
    return 2;
  }
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200;
  const bool with_cpu = !(argc > 3 && std::string(argv[3]) == "gpu");
  const bool moe_only = argc > 4 && std::string(argv[4]) == "moe";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // 1. bandwidth
  const size_t bw_bytes = size_t(2) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bw_bytes));
  CK(cudaMalloc(&b, bw_bytes));
  CK(cudaMemset(a, 1, bw_bytes));
  for (int i = 0; i < 3; ++i) CK(cudaMemcpy(b, a, bw_bytes, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(e0));
  for (int i = 0; i < 10; ++i) CK(cudaMemcpyAsync(b, a, bw_bytes, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  const double copy_bw = 2.0 * bw_bytes * 10 / (ms * 1e-3);
  const double read_bw = spw::bench::hbm_read_bandwidth(a, bw_bytes, prop.multiProcessorCount);
  std::printf("hbm copy bandwidth (read+write bytes): %.0f GB/s\nhbm read bandwidth: %.0f GB/s\n", copy_bw / 1e9, read_bw / 1e9);
  CK(cudaFree(a));
  CK(cudaFree(b));

  // 2. tensors
  std::vector<std::string> files;
  if (!moe_only)
    for (auto& e : std::filesystem::directory_iterator(argv[1]))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::printf("\n| tensor | path | K | cb | k×n | m | spillway µs | trellis GB/s | vs copy-bw roofline | vs read-bw roofline |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> cpu_lines;
  for (const std::string& path : files) {
    auto f = SafetensorsFile::open(path);
    if (!f) { std::fprintf(stderr, "%s\n", f.error().message.c_str()); return 1; }
    std::string name = std::filesystem::path(path).stem().string();
    auto t = exl3_load(*f.value(), name);
    if (!t) { std::fprintf(stderr, "%s\n", t.error().message.c_str()); return 1; }
    const size_t tb = t->trellis_nbytes();
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t(512) << 20) / tb + 1));
    std::vector<Exl3CudaTensor> dts(copies);
    uint16_t *suh, *svh;
    CK(cudaMalloc(&suh, t->k * 2));
    CK(cudaMalloc(&svh, t->n * 2));
    CK(cudaMemcpy(suh, t->suh.data(), t->k * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(svh, t->svh.data(), t->n * 2, cudaMemcpyHostToDevice));
    for (auto& d : dts) {
      uint16_t* tr;
      CK(cudaMalloc(&tr, tb));
      CK(cudaMemcpy(tr, t->trellis, tb, cudaMemcpyHostToDevice));
      d.trellis = tr, d.suh = suh, d.svh = svh, d.k = t->k, d.n = t->n, d.bits = t->bits, d.codebook = t->codebook;
    }
    Exl3CudaWorkspace ws;
    if (!exl3_cuda_workspace_alloc(ws, t->k, t->n).ok()) return 1;
    float *x, *y;
    CK(cudaMalloc(&x, 64 * t->k * 4));
    CK(cudaMalloc(&y, 64 * t->n * 4));
    std::vector<float> xh(64 * t->k);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    for (auto& v : xh) v = nd(rng);
    CK(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
    for (Exl3GemmPath path : {Exl3GemmPath::kXSmem, Exl3GemmPath::kBulk})
      for (int m : {1, 8, 16}) {
        for (int i = 0; i < 20; ++i) (void)exl3_gemm_cuda(dts[i % copies], x, m, y, ws, nullptr, path);
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0));
        for (int i = 0; i < iters; ++i) (void)exl3_gemm_cuda(dts[i % copies], x, m, y, ws, nullptr, path);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = ms * 1e3 / iters;
        std::printf("| %s | %s | %g | %s | %lldx%lld | %d | %.2f | %.0f | %.1f%% | %.1f%% |\n", name.c_str(),
                    exl3_gemm_path_name(path), t->bits.k_x2 / 2.0, exl3_codebook_name(t->codebook), (long long)t->k,
                    (long long)t->n, m, us, tb / (us * 1e-6) / 1e9, 100.0 * (tb / copy_bw) / (us * 1e-6),
                    100.0 * (tb / read_bw) / (us * 1e-6));
      }
    // Launch-shape sweep of the default path at m = 1: k splits for 2..8 blocks per SM.
    for (int bps : {2, 6, 8}) {
      ws.blocks_per_sm = bps;
      for (int i = 0; i < 20; ++i) (void)exl3_gemm_cuda(dts[i % copies], x, 1, y, ws);
      CK(cudaDeviceSynchronize());
      CK(cudaEventRecord(e0));
      for (int i = 0; i < iters; ++i) (void)exl3_gemm_cuda(dts[i % copies], x, 1, y, ws);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = ms * 1e3 / iters;
      std::printf("| %s | bulk, %d blocks/SM | %g | %s | %lldx%lld | 1 | %.2f | %.0f | %.1f%% | %.1f%% |\n", name.c_str(), bps,
                  t->bits.k_x2 / 2.0, exl3_codebook_name(t->codebook), (long long)t->k, (long long)t->n, us,
                  tb / (us * 1e-6) / 1e9, 100.0 * (tb / copy_bw) / (us * 1e-6), 100.0 * (tb / read_bw) / (us * 1e-6));
    }
    ws.blocks_per_sm = 0;
    // CPU kernel on the same tensor (host memory), m = 1 and 16.
    for (int m : {1, 16}) {
      if (!with_cpu) break;
      std::vector<float> yc(m * t->n);
      exl3_matmul_cpu(*t, xh.data(), m, yc.data());
      const int reps = 5;
      auto c0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) exl3_matmul_cpu(*t, xh.data(), m, yc.data());
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count() / reps;
      char line[256];
      std::snprintf(line, sizeof line, "| %s | %s | %lldx%lld | %d | %.0f | %.2f |", name.c_str(), cpu_isa_name(cpu_isa_detect()),
                    (long long)t->k, (long long)t->n, m, us, tb / (us * 1e-6) / 1e9);
      cpu_lines.push_back(line);
    }
    for (auto& d : dts) CK(cudaFree(const_cast<uint16_t*>(d.trellis)));
    CK(cudaFree(suh));
    CK(cudaFree(svh));
    CK(cudaFree(x));
    CK(cudaFree(y));
    exl3_cuda_workspace_free(ws);
  }
  bench_moe(iters, read_bw, e0, e1);
  {
    // The HostGpu tier: the same kernels reading pinned host memory, against the mapped read rate of this host.
    const size_t pin_bytes = size_t(1) << 30;
    void* pin = nullptr;
    void* pin_dev = nullptr;
    CK(cudaHostAlloc(&pin, pin_bytes, cudaHostAllocMapped));
    std::memset(pin, 1, pin_bytes);
    CK(cudaHostGetDevicePointer(&pin_dev, pin, 0));
    const double mapped_bw = spw::bench::hbm_read_bandwidth(pin_dev, pin_bytes, prop.multiProcessorCount);
    CK(cudaFreeHost(pin));
    std::printf("\nmapped pinned host memory read by the same read kernel (1 GiB): %.1f GB/s\n", mapped_bw / 1e9);
    bench_moe(std::max(10, iters / 10), mapped_bw, e0, e1, /*mapped=*/true);
  }
  if (!moe_only) bench_prefill(e0, e1);
  if (with_cpu) {
    std::printf("\nCPU (%u threads):\n| tensor | isa | k×n | m | µs | trellis GB/s |\n|---|---|---|---|---|---|\n",
                static_cast<unsigned>(global_pool().size()));
    for (auto& l : cpu_lines) std::printf("%s\n", l.c_str());
  }
  return 0;
}
