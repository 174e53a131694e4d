// Routed experts of one MoE layer on the CPU, straight from EXL3 trellis data: the entry point for the
// CPU host-expert runtime (experts spilled to host RAM run here; spec deepseek-v4.md §4.6).
//
// What it computes: for every token j and slot s with e = expert_ids[j·top_k + s] ≥ 0 and routing
// weight w = weights[j·top_k + s]:
//   g = x_j·W1_e, u = x_j·W3_e (gate, up), h = silu(min(g, L)) · clamp(u, −L, L) · w  (L = swiglu_limit;
//   L ≤ 0: no clamp), out_j += h·W2_e.
// The routing weight is applied before W2, as DeepSeek's reference does (ref::swiglu). Tokens are grouped
// per expert, so each selected expert's trellis is read once per call whatever its token count; all
// gate/up products of all selected experts form one parallel pass over the thread pool, all down
// products a second one (exl3_gemm.h's kernels and k-slices, parts spread evenly over the threads).
//
// Contract: x [n_tokens][d] fp32 row-major; expert_ids, weights [n_tokens][top_k]; out [n_tokens][d]
// fp32, accumulated (+=), must not alias x. experts[e] holds W1/W3 [d][f] and W2 [f][d] (k×n as stored,
// multiples of 128). An expert id ≥ n_experts is a caller bug (checked, aborts). No rounding to bf16
// between stages (the runtime decides where activations are rounded). Scratch is per calling thread and
// kept. Accuracy: per product as exl3_matmul_cpu (fp32, summation order only).
// Tests: tests/unit/test_exl3_moe_cpu.cpp (against a plain composition of exl3_matmul_ref and
// ref::swiglu). Bench: bench/exl3/bench_exl3_cpu.cpp (one V4.1 layer, 6 experts × 1 token).
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "cpu/exl3_gemm.h"
#include "formats/exl3.h"

namespace spw {

struct Exl3ExpertWeights {
  const Exl3Tensor* w1 = nullptr;  // gate [d][f]
  const Exl3Tensor* w3 = nullptr;  // up   [d][f]
  const Exl3Tensor* w2 = nullptr;  // down [f][d]
};

void exl3_moe_cpu(const Exl3ExpertWeights* experts, int64_t n_experts, const float* x, int64_t n_tokens,
                  const int32_t* expert_ids, const float* weights, int64_t top_k, float swiglu_limit, float* out,
                  ThreadPool* pool = nullptr, const Exl3CpuOptions& opt = {});

}  // namespace spw
