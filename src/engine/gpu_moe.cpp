// MoE sublayer on the GPU in four stages (router → dispatch → experts → combine, model/moe.cpp),
// plus the shared expert; and V4.1 Engram (model/engram.cpp). First version: the router runs on
// the GPU, the per-expert token lists are built on the host, and each routed expert is three
// linear calls on its gathered tokens — dense (MXFP4) or EXL3 (cuda/exl3_gemm.h) — (see
// gpu_model.h for what is slow; the fused EXL3 decode kernel, cuda/exl3_moe.h, is not used yet).
#include <cmath>
#include <cstring>

#include "cuda/ops/moe.h"
#include "engine/engine_kernels.h"
#include "engine/gpu_step.h"
#include "formats/quant.h"
#include "ops/ref/linalg.h"

namespace spw::engine {
namespace {

using Buf = DeviceBuffer<float>;

// y [m, t.n] = x·W of an EXL3 expert linear, rounded like linear() rounds a BF16-kind product (the CPU
// reference keeps EXL3 experts as an unquantized linear: model/exl3_experts.h).
Status exl3_linear(GpuStep& s, const Exl3CudaTensor& t, const float* x, int m, float* y) {
  SPW_TRY(exl3_gemm_cuda(t, x, m, y, s.st.exl3_ws, s.stream));
  return to_activation(s, y, int64_t(m) * t.n);
}

// One expert on m gathered rows xs [m, d]: ys [m, d] = w2 · bf16(silu(min(w1·x, L)) · clamp(w3·x, ±L) · weight).
Status run_expert(GpuStep& s, const DeviceExpert& e, const float* xs, int m, const float* row_weights, float limit,
                  Buf& ys) {
  const bool exl3 = e.is_exl3();
  const int F = exl3 ? int(e.exl3[0].n) : e.w1.n_out, d = exl3 ? int(e.exl3[1].n) : e.w2.n_out;
  Buf g, u, h;
  SPW_TRY(g.alloc(size_t(m) * F));
  SPW_TRY(u.alloc(size_t(m) * F));
  SPW_TRY(h.alloc(size_t(m) * F));
  SPW_TRY(ys.alloc(size_t(m) * d));
  if (exl3) {
    SPW_TRY(exl3_linear(s, e.exl3[0], xs, m, g.get()));  // [m, F]
    SPW_TRY(exl3_linear(s, e.exl3[2], xs, m, u.get()));  // [m, F]
  } else {
    SPW_TRY(linear(s, e.w1, xs, m, g.get()));  // [m, F]
    SPW_TRY(linear(s, e.w3, xs, m, u.get()));  // [m, F]
  }
  SPW_TRY(cuda::swiglu(g.get(), F, u.get(), F, row_weights, m, F, limit, s.num.bf16_activations, h.get(), s.stream));
  if (exl3) return exl3_linear(s, e.exl3[1], h.get(), m, ys.get());  // [m, d]
  return linear(s, e.w2, h.get(), m, ys.get());                       // [m, d]
}

}  // namespace

Status moe(GpuStep& s, int layer, const float* x, float* out) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const int n = s.n, d = c.d_model, E = c.n_experts, K = c.top_k;
  const float route_eps = c.is_v41() ? 1e-20f : 0.f;

  // Router: [n, E] logits (FP32 product) → [n, top_k] experts and weights.
  Buf logits, weights;
  DeviceBuffer<int32_t> experts;
  SPW_TRY(logits.alloc(size_t(n) * E));
  SPW_TRY(weights.alloc(size_t(n) * K));
  SPW_TRY(experts.alloc(size_t(n) * K));
  SPW_TRY(linear(s, lw.gate, x, n, logits.get()));
  if (c.layers[layer].hash_routed)
    SPW_TRY(cuda::router_hash(logits.get(), s.tokens_d.get(), lw.tid2eid, n, E, K, route_eps, c.route_scale,
                              experts.get(), weights.get(), s.stream));
  else
    SPW_TRY(cuda::router_topk(logits.get(), lw.gate_bias, n, E, K, route_eps, c.route_scale, experts.get(),
                              weights.get(), s.stream));

  // Dispatch (host): the tokens of each expert and their route weights.
  std::vector<int32_t> ex;
  std::vector<float> wt;
  SPW_TRY(download(experts.get(), experts.size(), ex));
  SPW_TRY(download(weights.get(), weights.size(), wt));
  std::vector<std::vector<int32_t>> tokens_of(E);
  std::vector<std::vector<float>> weights_of(E);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < K; ++k) {
      tokens_of[ex[size_t(i) * K + k]].push_back(i);
      weights_of[ex[size_t(i) * K + k]].push_back(wt[size_t(i) * K + k]);
    }

  // Experts, in expert order, each added into acc [n, d] at its tokens (f32, the reference's order).
  Buf acc, xs, ys, rw, shared;
  DeviceBuffer<int32_t> rows;
  SPW_TRY(acc.alloc(size_t(n) * d));
  SPW_CUDA_TRY(cudaMemset(acc.get(), 0, acc.nbytes()));
  for (int e = 0; e < E; ++e) {
    const int m = int(tokens_of[e].size());
    if (m == 0) continue;
    SPW_TRY(upload(tokens_of[e], rows));
    SPW_TRY(upload(weights_of[e], rw));
    SPW_TRY(xs.alloc(size_t(m) * d));
    SPW_TRY(gather_rows_cuda(x, rows.get(), m, d, xs.get(), s.stream));                       // [m, d]
    SPW_TRY(run_expert(s, lw.experts[e], xs.get(), m, rw.get(), c.swiglu_limit, ys));          // [m, d]
    SPW_TRY(scatter_add_rows_cuda(acc.get(), ys.get(), rows.get(), m, d, s.stream));           // acc[rows] += ys
  }

  // Shared expert (clamped in V4.1 only), combine, bf16.
  SPW_TRY(run_expert(s, lw.shared, x, n, nullptr, c.is_v41() ? c.swiglu_limit : 0.f, shared));  // [n, d]
  SPW_TRY(add_cuda(acc.get(), shared.get(), int64_t(n) * d, out, s.stream));
  return to_activation(s, out, int64_t(n) * d);
}

Status engram(GpuStep& s, int layer, float* streams) {
  const ModelConfig& c = s.c;
  const EngramWeights& ew = s.host_w.layers[layer].engram;
  int slot = 0;
  while (c.engram_layers[slot] != layer) ++slot;
  const ref::EngramHashParams& hp = s.st.engram_params[slot];
  const int n = s.n, d = c.d_model, hc = c.hc_mult, hd = c.engram_head_dim, M = c.engram_max_ngram;
  const int n_rows = (M - 1) * c.engram_n_heads, n_in = n_rows * hd;

  // Gather (host, tables in host memory): rows [n, n_rows·hd] dequantized from fp8 with 1×32 ue8m0 scales.
  std::vector<float> gathered(size_t(n) * n_in);
  std::vector<int64_t> row_ids(n_rows), history(M);
  const std::vector<int64_t>& recent = s.seq.engram_recent;  // before this step's tokens
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < M; ++k) {  // history[k] = compressed id at position (p+i−k), −2 before the start
      const int64_t j = int64_t(i) - k;
      if (j >= 0) history[k] = s.host_w.engram_token_map[s.tokens[j]];
      else if (int64_t(recent.size()) + j >= 0) history[k] = recent[recent.size() + j];
      else history[k] = -2;
    }
    ref::engram_rows(hp, history.data(), row_ids.data());
    for (int r = 0; r < n_rows; ++r)
      dequant_fp8_rows(ew.table->data + size_t(row_ids[r]) * hd, ew.table_scale->data + size_t(row_ids[r]) * (hd / 32),
                       1, hd, 32, gathered.data() + size_t(i) * n_in + size_t(r) * hd);
  }

  // kv [n, (hc+1)·d] = wkv · rows on the GPU: hc keys and one value.
  Buf rows_d, kv_d;
  SPW_TRY(upload(gathered, rows_d));
  SPW_TRY(kv_d.alloc(size_t(n) * (hc + 1) * d));
  SPW_TRY(linear(s, s.w.layers[layer].engram_wkv, rows_d.get(), n, kv_d.get()));

  // The gate per residual copy (host: f64 sums in the reference's order), streams updated in place.
  std::vector<float> kv, x;
  SPW_TRY(download(kv_d.get(), kv_d.size(), kv));
  SPW_TRY(download(streams, size_t(n) * hc * d, x));
  const float inv_sqrt_d = 1.0f / std::sqrt(float(d));
  for (int i = 0; i < n; ++i) {
    const float* key = kv.data() + size_t(i) * (hc + 1) * d;
    const float* value = key + size_t(hc) * d;
    for (int j = 0; j < hc; ++j) {
      float* xj = x.data() + (size_t(i) * hc + j) * d;
      const float* kj = key + size_t(j) * d;
      double sx = 0, sk = 0, dot = 0;
      for (int ch = 0; ch < d; ++ch) {
        const float wgt = ew.q_weight[size_t(j) * d + ch] * ew.k_weight[size_t(j) * d + ch];
        sx += double(xj[ch]) * xj[ch];
        sk += double(kj[ch]) * kj[ch];
        dot += double(xj[ch]) * wgt * kj[ch];
      }
      const float rx = 1.0f / std::sqrt(float(sx / d) + c.norm_eps);
      const float rk = 1.0f / std::sqrt(float(sk / d) + c.norm_eps);
      const float g_dot = float(dot) * rx * rk * inv_sqrt_d;
      const float sign = float((g_dot > 0.f) - (g_dot < 0.f));
      const float gate = ref::sigmoid(sign * std::sqrt(std::max(std::fabs(g_dot), 1e-6f)));
      for (int ch = 0; ch < d; ++ch) xj[ch] += gate * value[ch];
      if (s.num.bf16_activations) ref::round_bf16_inplace(xj, d);
    }
  }
  SPW_CUDA_TRY(cudaMemcpy(streams, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  return {};
}

}  // namespace spw::engine
