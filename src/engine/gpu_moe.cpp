// MoE sublayer on the GPU in four stages (router → dispatch → experts → combine, model/moe.cpp),
// plus the shared expert; and V4.1 Engram (model/engram.cpp). The router runs on the GPU; then
//  - device dispatch (steps of ≤ 16 rows, MoePaths::dense_device_rows for dense experts; GpuModelOptions::moe_dispatch):
//    dense experts as grouped
//    GEMVs over the (token, slot) pairs, EXL3 experts as the fused decode kernel (cuda/exl3_moe.h,
//    reference_rounding); both read the expert ids from device memory, no host round trip
//    (moe_dispatch.h);
//  - host dispatch (prefill chunks): the per-expert token lists are built on the host
//    and each routed expert is three linear calls on its gathered tokens (dense experts, MXFP4), or
//    every expert's projection at once in grouped EXL3 launches (cuda/exl3_grouped.h); either way
//    each expert's weights are read once per 64 of its tokens.
// Both add a token's experts in ascending expert order. Engram: host hashing, device gather from the
// mapped host tables and device gate (engram_kernels.h).
#include <algorithm>
#include <cstring>

#include "cuda/exl3_grouped.h"
#include "cuda/ops/act_quant.h"
#include "cuda/ops/moe.h"
#include "engine/engine_kernels.h"
#include "engine/engram_kernels.h"
#include "engine/gpu_step.h"

namespace spw::engine {
namespace {

using Buf = DeviceSpan<float>;

// y [m, t.n] = x·W of an EXL3 expert linear, rounded like linear() rounds a BF16-kind product (the CPU
// reference keeps EXL3 experts as an unquantized linear: model/exl3_experts.h).
// The kernel rounds y as it writes it (bit-identical to to_activation afterwards).
Status exl3_linear(GpuStep& s, const Exl3CudaTensor& t, const float* x, int m, float* y) {
  return exl3_gemm_cuda(t, x, m, y, s.st.exl3_ws, s.stream, Exl3GemmPath::kAuto, s.num.bf16_activations);
}

// One expert on m gathered rows xs [m, d]: ys [m, d] = w2 · bf16(silu(min(w1·x, L)) · clamp(w3·x, ±L) · weight).
Status run_expert(GpuStep& s, const DeviceExpert& e, const float* xs, int m, const float* row_weights, float limit,
                  Buf& ys) {
  const bool exl3 = e.is_exl3();
  const int F = exl3 ? int(e.exl3[0].n) : e.w1.n_out, d = exl3 ? int(e.exl3[1].n) : e.w2.n_out;
  Buf g, u, h;
  SPW_TRY(s.alloc(g, size_t(m) * F));
  SPW_TRY(s.alloc(u, size_t(m) * F));
  SPW_TRY(s.alloc(h, size_t(m) * F));
  SPW_TRY(s.alloc(ys, size_t(m) * d));
  if (exl3) {
    SPW_TRY(exl3_linear(s, e.exl3[0], xs, m, g.get()));  // [m, F]
    SPW_TRY(exl3_linear(s, e.exl3[2], xs, m, u.get()));  // [m, F]
  } else if (e.w13.stacked() && linear_uses_gemv(s.path, m)) {  // one launch, bit-identical to the two below
    float* const ys[] = {g.get(), u.get()};
    SPW_TRY(stacked_linear_cuda(e.w13.w, e.w13.rows, xs, m, ys, s.num.bf16_activations, s.st.ws, s.stream));
  } else {
    SPW_TRY(linear(s, e.w1, xs, m, g.get()));  // [m, F]
    SPW_TRY(linear(s, e.w3, xs, m, u.get()));  // [m, F]
  }
  SPW_TRY(cuda::swiglu(g.get(), F, u.get(), F, row_weights, m, F, limit, s.num.bf16_activations, h.get(), s.stream));
  if (exl3) return exl3_linear(s, e.exl3[1], h.get(), m, ys.get());  // [m, d]
  return linear(s, e.w2, h.get(), m, ys.get());                       // [m, d]
}

// The step's routes on the host, sorted by expert (a counting sort): sorted row `at` is slot pairs[at] % K of token
// rows[at] (pair pairs[at] = token·K + slot), expert expert_of[at], route weight weights[at]; expert e's rows are
// first[e] .. first[e + 1], in token order; slots with ids < 0 are left out when skip_negative. A host round trip
// (the ids and weights come down).
struct SortedRoutes {
  std::vector<int32_t> first, rows, pairs, expert_of;
  std::vector<float> weights;
};
Status sort_routes(GpuStep& s, const DeviceSpan<int32_t>& experts, const Buf& weights, bool skip_negative,
                   SortedRoutes& r) {
  const int n = s.n, E = s.c.n_experts, K = s.c.top_k;
  std::vector<int32_t> ex;
  std::vector<float> wt;
  SPW_TRY(s.download(experts.get(), experts.size(), ex));
  SPW_TRY(s.download(weights.get(), weights.size(), wt));
  r.first.assign(E + 1, 0);
  for (int32_t e : ex) {
    // Ids < 0 are slots computed elsewhere (experts on the CPU: host_experts.h) when `skip_negative`; anything
    // else outside 0..E−1 is a bug upstream, reported instead of written out of bounds.
    if (e < 0 && skip_negative) continue;
    if (e < 0 || e >= E) return make_error("MoE host dispatch: expert id ", e, " outside 0..", E - 1);
    ++r.first[e + 1];
  }
  for (int e = 0; e < E; ++e) r.first[e + 1] += r.first[e];
  const size_t routed = size_t(r.first[E]);
  r.rows.resize(routed), r.pairs.resize(routed), r.expert_of.resize(routed), r.weights.resize(routed);
  std::vector<int32_t> fill(r.first.begin(), r.first.end() - 1);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < K; ++k) {
      const int32_t p = i * K + k, e = ex[p];
      if (e < 0) continue;
      const int32_t at = fill[e]++;
      r.rows[at] = i, r.pairs[at] = p, r.expert_of[at] = e, r.weights[at] = wt[p];
    }
  return {};
}

// Dispatch on the host: the tokens of each expert and their route weights go to the host; each
// expert runs on its gathered rows and is added into acc [n, d] at its tokens, in expert order. The
// row lists of all experts go back to the device as one array (two copies per layer, not two per
// expert: a 4096-token chunk touches every one of V4.1's 384 experts).
Status routed_host(GpuStep& s, int layer, const float* x, const DeviceSpan<int32_t>& experts, const Buf& weights,
                   bool skip_negative, float* acc) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const int n = s.n, d = c.d_model, E = c.n_experts;
  SortedRoutes r;
  SPW_TRY(sort_routes(s, experts, weights, skip_negative, r));
  const std::vector<int32_t>& first = r.first;
  DeviceSpan<int32_t> rows;
  Buf rw;
  SPW_TRY(s.upload(r.rows, rows));
  SPW_TRY(s.upload(r.weights, rw));
  SPW_CUDA_TRY(cudaMemsetAsync(acc, 0, sizeof(float) * size_t(n) * d, s.stream));
  for (int e = 0; e < E; ++e) {
    const int m = first[e + 1] - first[e];
    if (m == 0) continue;
    ArenaScope scope(s.st.arena);
    Buf xs, ys;
    const int32_t* er = rows.get() + first[e];
    SPW_TRY(s.alloc(xs, size_t(m) * d));
    SPW_TRY(gather_rows_cuda(x, er, m, d, xs.get(), s.stream));                                    // [m, d]
    SPW_TRY(run_expert(s, lw.experts[e], xs.get(), m, rw.get() + first[e], c.swiglu_limit, ys));  // [m, d]
    SPW_TRY(scatter_add_rows_cuda(acc, ys.get(), er, m, d, s.stream));                             // acc[rows] += ys
  }
  return {};
}

// EXL3 experts under host dispatch (cuda/exl3_grouped.h): the rows sorted by expert as above, then each
// projection is one grouped launch per row class over all experts instead of three per expert (a
// 4096-token chunk made ~1,150 expert launches per V4.1 layer, plus the remainders of experts past 64
// rows). The down projection writes each (token, slot) pair's row, and moe_combine_cuda adds a token's
// slots in ascending expert id: the per-expert path's numerics up to the fp32 order of the sums inside
// each projection. MoePaths::exl3_grouped = false (SPILLWAY_EXL3_GROUPED=0) keeps the per-expert path.
Status routed_exl3_grouped(GpuStep& s, int layer, const float* x, const DeviceSpan<int32_t>& experts,
                           const Buf& weights, bool skip_negative, float* acc) {
  const ModelConfig& c = s.c;
  const Exl3CudaMoeLayer& L = s.st.exl3_moe[layer].layer;
  const int n = s.n, K = c.top_k;
  const int64_t d = L.d, F = L.f, pairs_total = int64_t(n) * K, width = std::max(d, F);
  const bool rb = s.num.bf16_activations;
  SortedRoutes r;
  SPW_TRY(sort_routes(s, experts, weights, skip_negative, r));
  const int64_t P = int64_t(r.rows.size());  // the routed pairs (all of them unless some are on the CPU)
  if (P == 0) {  // every slot of the step is on the CPU
    SPW_CUDA_TRY(cudaMemsetAsync(acc, 0, sizeof(float) * size_t(n) * d, s.stream));
    return {};
  }
  const Exl3GroupPlan plan = exl3_group_plan(r.first, s.exl3_item_class);
  DeviceSpan<int32_t> rows, pairs, row_expert;
  DeviceSpan<Exl3GroupItem> items;
  DeviceSpan<uint16_t> xr;  // fp16 rotated rows
  DeviceSpan<uint32_t> counters;
  Buf rw, g, u, ys;
  SPW_TRY(s.upload(r.rows, rows));
  SPW_TRY(s.upload(r.pairs, pairs));
  SPW_TRY(s.upload(r.expert_of, row_expert));
  SPW_TRY(s.upload(r.weights, rw));
  SPW_TRY(s.upload(plan.items, items));
  SPW_TRY(s.alloc(xr, size_t(P) * width));
  SPW_TRY(s.alloc(counters, std::max<size_t>(1, plan.items.size() * size_t(width / 128))));
  SPW_TRY(s.alloc(g, size_t(P) * F));
  SPW_TRY(s.alloc(u, size_t(P) * F));
  SPW_TRY(s.alloc(ys, size_t(pairs_total) * d));
  // Exl3CudaExpert's projections: 0 = w1 (gate), 1 = w3 (up), 2 = w2 (down).
  SPW_TRY(exl3_rotate_grouped_cuda(L, 0, x, rows.get(), 1, row_expert.get(), P, xr.get(), s.stream));
  SPW_TRY(exl3_grouped_gemm_cuda(L, 0, plan, items.get(), xr.get(), g.get(), nullptr, P, counters.get(), rb, s.stream));
  SPW_TRY(exl3_rotate_grouped_cuda(L, 1, x, rows.get(), 1, row_expert.get(), P, xr.get(), s.stream));
  SPW_TRY(exl3_grouped_gemm_cuda(L, 1, plan, items.get(), xr.get(), u.get(), nullptr, P, counters.get(), rb, s.stream));
  SPW_TRY(cuda::swiglu(g.get(), F, u.get(), F, rw.get(), P, F, c.swiglu_limit, rb, g.get(), s.stream));  // h = g
  SPW_TRY(exl3_rotate_grouped_cuda(L, 2, g.get(), nullptr, 1, row_expert.get(), P, xr.get(), s.stream));
  SPW_TRY(exl3_grouped_gemm_cuda(L, 2, plan, items.get(), xr.get(), ys.get(), pairs.get(), pairs_total, counters.get(),
                                 rb, s.stream));  // [n·K, d] in (token, slot) order; pairs not routed here stay 0
  return moe_combine_cuda(ys.get(), experts.get(), n, K, d, acc, s.stream);  // [n, d]
}

// EXL3 experts of a decode step (device dispatch, ≤ 16 rows): every (token, slot) pair is one item of the
// grouped kernels (one row, in pair order, expert from the router's ids in device memory), then
// moe_combine_cuda. Eight launches, CUDA-graph capturable, the per-expert path's numerics. The fused
// cooperative kernel does the same in one launch and wins below 8 rows (on the H200, one V4.1 layer at
// 1 token: 97.6 µs fused vs 119.2 grouped; at 8 tokens 621 vs 551), so steps of fewer rows take it.
// MoePaths::exl3_decode (SPILLWAY_EXL3_DECODE=fused or =grouped) forces one.
constexpr int kExl3GroupedDecodeRows = 8;
bool exl3_decode_grouped(const MoePaths& p, int rows) {
  switch (p.exl3_decode) {
    case Exl3DecodeKernel::kFused: return false;
    case Exl3DecodeKernel::kGrouped: return true;
    case Exl3DecodeKernel::kByRows: break;
  }
  return rows >= kExl3GroupedDecodeRows;
}

Status routed_exl3_pairs(GpuStep& s, const Exl3CudaMoeLayer& L, const float* x, const DeviceSpan<int32_t>& experts,
                         const Buf& weights, float* acc) {
  const ModelConfig& c = s.c;
  const int n = s.n, K = c.top_k;
  const int64_t d = L.d, F = L.f, P = int64_t(n) * K, width = std::max(d, F);
  const bool rb = s.num.bf16_activations;
  DeviceSpan<uint16_t> xr;
  DeviceSpan<uint32_t> counters;
  Buf g, u, ys;
  SPW_TRY(s.alloc(xr, size_t(P) * width));
  SPW_TRY(s.alloc(counters, size_t(P) * size_t(width / 128)));
  SPW_TRY(s.alloc(g, size_t(P) * F));
  SPW_TRY(s.alloc(u, size_t(P) * F));
  SPW_TRY(s.alloc(ys, size_t(P) * d));
  const int32_t* ex = experts.get();
  SPW_TRY(exl3_rotate_grouped_cuda(L, 0, x, nullptr, K, ex, P, xr.get(), s.stream));  // pair p reads token p / K
  SPW_TRY(exl3_grouped_pairs_gemm_cuda(L, 0, ex, P, xr.get(), g.get(), counters.get(), rb, s.stream));
  SPW_TRY(exl3_rotate_grouped_cuda(L, 1, x, nullptr, K, ex, P, xr.get(), s.stream));
  SPW_TRY(exl3_grouped_pairs_gemm_cuda(L, 1, ex, P, xr.get(), u.get(), counters.get(), rb, s.stream));
  SPW_TRY(cuda::swiglu(g.get(), F, u.get(), F, weights.get(), P, F, c.swiglu_limit, rb, g.get(), s.stream));  // h = g
  SPW_TRY(exl3_rotate_grouped_cuda(L, 2, g.get(), nullptr, 1, ex, P, xr.get(), s.stream));
  SPW_TRY(exl3_grouped_pairs_gemm_cuda(L, 2, ex, P, xr.get(), ys.get(), counters.get(), rb, s.stream));
  return moe_combine_cuda(ys.get(), ex, n, K, d, acc, s.stream);  // [n, d]
}

// Dispatch on the device: every (token, slot) pair p = t·K + j through its expert (grouped GEMVs,
// moe_dispatch.h), then each token's pairs summed in expert order into acc [n, d].
Status routed_device(GpuStep& s, int layer, const float* x, const DeviceSpan<int32_t>& experts, const Buf& weights,
                     float* acc) {
  const ModelConfig& c = s.c;
  const ExpertTable& t = s.st.expert_tables[layer];
  const int n = s.n, d = c.d_model, K = c.top_k, F = t.shape[0].n_out;
  const int64_t P = int64_t(n) * K;
  const bool rb = s.num.bf16_activations;
  Buf xq, g, u, h, ys;
  const float* x_in = x;
  if (t.shape[0].act_block > 0) {  // x̂ as the dense library's activation prep makes it
    SPW_TRY(s.alloc(xq, size_t(n) * d));
    SPW_CUDA_TRY(cudaMemcpyAsync(xq.get(), x, xq.nbytes(), cudaMemcpyDeviceToDevice, s.stream));
    SPW_TRY(cuda::fake_quant_fp8(xq.get(), n, d, d, t.shape[0].act_block, s.stream));
    x_in = xq.get();
  }
  SPW_TRY(s.alloc(g, size_t(P) * F));
  SPW_TRY(s.alloc(u, size_t(P) * F));
  SPW_TRY(s.alloc(h, size_t(P) * F));
  SPW_TRY(s.alloc(ys, size_t(P) * d));
  SPW_TRY(grouped_expert_gemv_cuda(t, 0, x_in, K, experts.get(), P, g.get(), rb, s.stream));  // [P, F]
  SPW_TRY(grouped_expert_gemv_cuda(t, 2, x_in, K, experts.get(), P, u.get(), rb, s.stream));  // [P, F]
  SPW_TRY(cuda::swiglu(g.get(), F, u.get(), F, weights.get(), P, F, c.swiglu_limit, rb, h.get(), s.stream));
  if (t.shape[1].act_block > 0) SPW_TRY(cuda::fake_quant_fp8(h.get(), P, F, F, t.shape[1].act_block, s.stream));
  SPW_TRY(grouped_expert_gemv_cuda(t, 1, h.get(), 1, experts.get(), P, ys.get(), rb, s.stream));  // [P, d]
  return moe_combine_cuda(ys.get(), experts.get(), n, K, d, acc, s.stream);                      // [n, d]
}

bool use_device_dispatch(const GpuStep& s, int layer) {
  const bool dense = s.st.expert_tables[layer].ready();
  // The grouped pairs path holds every pair in one workspace; the fused kernel launches in pieces.
  const bool exl3 = s.st.exl3_moe[layer].ready() &&
                    (int64_t(s.n) * s.c.top_k <= s.st.exl3_moe_ws.max_pairs || !exl3_decode_grouped(s.moe_paths, s.n));
  if (s.moe_dispatch == MoeDispatch::kHost || !(dense || exl3)) return false;
  return s.moe_dispatch == MoeDispatch::kDevice ||
         s.n <= (dense ? s.moe_paths.dense_device_rows : s.moe_paths.exl3_device_rows);
}

}  // namespace

bool moe_on_device(const GpuStep& s) {
  for (int l = 0; l < s.c.n_layers; ++l)
    if (!use_device_dispatch(s, l)) return false;
  return true;
}

Status moe(GpuStep& s, int layer, const float* x, float* out) {
  const ModelConfig& c = s.c;
  const DeviceLayer& lw = s.w.layers[layer];
  const int n = s.n, d = c.d_model, E = c.n_experts, K = c.top_k;
  const float route_eps = c.is_v41() ? 1e-20f : 0.f;

  // Router: [n, E] logits (FP32 product) → [n, top_k] experts and weights.
  Buf logits, weights;
  DeviceSpan<int32_t> experts;
  SPW_TRY(s.alloc(logits, size_t(n) * E));
  SPW_TRY(s.alloc(weights, size_t(n) * K));
  SPW_TRY(s.alloc(experts, size_t(n) * K));
  SPW_TRY(linear(s, lw.gate, x, n, logits.get()));
  if (c.layers[layer].hash_routed)
    SPW_TRY(cuda::router_hash(logits.get(), s.tokens_d.get(), lw.tid2eid, n, E, K, route_eps, c.route_scale,
                              experts.get(), weights.get(), s.stream));
  else
    SPW_TRY(cuda::router_topk(logits.get(), lw.gate_bias, n, E, K, route_eps, c.route_scale, experts.get(),
                              weights.get(), s.stream));
  SPW_TRY(route_image_rows(s, layer, logits.get(), route_eps, experts.get(), weights.get()));
  if (s.st.routing_counts.get()) {  // serve --record-routing
    if (layer == 0) s.st.routing_tokens += n;
    SPW_TRY(count_routes_cuda(experts.get(), int64_t(n) * K, E, s.st.routing_counts.get() + size_t(layer) * E, s.stream));
  }

  SPW_TRY(s.dump("moe.experts", layer, experts.get(), experts.size()));
  SPW_TRY(s.dump("moe.weights", layer, weights.get(), weights.size()));

  // Experts on the CPU (host_experts.h): in steps of at most kCpuExpertMaxRows rows their slots go to the CPU worker,
  // which computes them while the GPU runs its own (the paths below see −1 in those slots); larger steps read them
  // from pinned host memory on the GPU like HostGpu experts.
  HostExperts* const cpu = s.st.host_experts && s.st.host_experts->serves(layer) && n <= kCpuExpertMaxRows
                               ? s.st.host_experts.get() : nullptr;
  DeviceSpan<int32_t> gpu_ids;
  if (cpu) {
    SPW_TRY(s.alloc(gpu_ids, size_t(n) * K));
    SPW_TRY(cpu->post(layer, x, experts.get(), weights.get(), n, gpu_ids.get(), s.stream));
  }
  const DeviceSpan<int32_t>& ids = cpu ? gpu_ids : experts;

  // Dispatch and experts → acc [n, d].
  Buf acc, shared;
  SPW_TRY(s.alloc(acc, size_t(n) * d));
  if (!use_device_dispatch(s, layer) && s.st.exl3_moe[layer].ready() && s.moe_paths.exl3_grouped)
    SPW_TRY(routed_exl3_grouped(s, layer, x, ids, weights, cpu != nullptr, acc.get()));
  else if (!use_device_dispatch(s, layer))
    SPW_TRY(routed_host(s, layer, x, ids, weights, cpu != nullptr, acc.get()));
  else if (s.st.expert_tables[layer].ready())
    SPW_TRY(routed_device(s, layer, x, ids, weights, acc.get()));
  else {
    // EXL3 on the device: HostGpu experts staged into HBM first where the layer has them (expert_staging.h).
    Exl3CudaMoeLayer L = s.st.exl3_moe[layer].layer;
    if (!s.st.on_host_gpu.empty() && s.st.on_host_gpu[layer].get())
      SPW_TRY(stage_host_experts_cuda(s.st.expert_staging, s.st.exl3_moe[layer].layer, ids.get(), int64_t(n) * K,
                                      s.st.on_host_gpu[layer].get(), L, s.stream));
    if (exl3_decode_grouped(s.moe_paths, n))  // grouped launches per (token, slot) pair
      SPW_TRY(routed_exl3_pairs(s, L, x, ids, weights, acc.get()));
    else  // the fused decode kernel with the per-expert path's roundings
      SPW_TRY(exl3_moe_decode_cuda(L, x, ids.get(), weights.get(), n, K, acc.get(), s.st.exl3_moe_ws, s.stream));
  }

  // Shared expert (clamped in V4.1 only), then the CPU's part of the routed sum, combine, bf16.
  SPW_TRY(run_expert(s, lw.shared, x, n, nullptr, c.is_v41() ? c.swiglu_limit : 0.f, shared));  // [n, d]
  if (cpu) SPW_TRY(cpu->collect(acc.get(), n, s.stream));
  SPW_TRY(s.dump("moe.routed", layer, acc.get(), acc.size()));
  SPW_TRY(s.dump("moe.shared", layer, shared.get(), shared.size()));
  return add_cuda(acc.get(), shared.get(), int64_t(n) * d, out, s.stream, s.num.bf16_activations);  // bf16
}

Status engram(GpuStep& s, int layer, float* streams) {
  const ModelConfig& c = s.c;
  int slot = 0;
  while (c.engram_layers[slot] != layer) ++slot;
  const ref::EngramHashParams& hp = s.st.engram_params[slot];
  const EngramTables& tables = s.st.engram_tables[slot];
  const int n = s.n, d = c.d_model, hc = c.hc_mult, hd = c.engram_head_dim, M = c.engram_max_ngram;
  const int n_rows = (M - 1) * c.engram_n_heads, n_in = n_rows * hd;

  // Table rows [n, n_rows] (host hashing over each sequence's n-gram history).
  std::vector<int64_t> row_ids(size_t(n) * n_rows), history(M);
  for (int i = 0; i < n; ++i) {
    const StepChunk& ch = s.chunks[s.row_chunk[i]];
    const std::vector<int64_t>& recent = ch.seq->engram_recent;  // before this step's tokens
    const int i_chunk = i - ch.row0;
    for (int k = 0; k < M; ++k) {  // history[k] = compressed id at position (p+i−k)
      const int64_t j = int64_t(i_chunk) - k;
      if (j >= 0 && !ch.images.empty() && ch.images.is_image[size_t(j)]) history[k] = ref::kEngramDead;
      else if (j >= 0) history[k] = s.host_w.engram_token_map[ch.tokens[j]];
      else if (int64_t(recent.size()) + j >= 0) history[k] = recent[recent.size() + j];
      else history[k] = ref::kEngramBeforeStart;
    }
    ref::engram_rows(hp, history.data(), row_ids.data() + size_t(i) * n_rows);
  }
  DeviceSpan<int64_t> ids;
  Buf rows, kv;
  SPW_TRY(s.alloc(rows, size_t(n) * n_in));
  SPW_TRY(s.alloc(kv, size_t(n) * (hc + 1) * d));
  // [n, n_rows·hd] dequantized from fp8 with 1×32 ue8m0 scales, read from host memory.
  if (tables.disk_table) {
    // Tables on disk: the host gathers the step's rows from the checkpoint's maps and uploads them.
    const size_t N = row_ids.size(), sb = size_t(hd / 32);
    std::vector<uint8_t> q(N * hd), sc(N * sb);
    std::vector<int64_t> iota(N);
    for (size_t i = 0; i < N; ++i) {
      std::memcpy(q.data() + i * hd, tables.disk_table + size_t(row_ids[i]) * hd, size_t(hd));
      std::memcpy(sc.data() + i * sb, tables.disk_scale + size_t(row_ids[i]) * sb, sb);
      iota[i] = int64_t(i);
    }
    DeviceSpan<uint8_t> q_d, sc_d;
    SPW_TRY(s.upload(q, q_d));
    SPW_TRY(s.upload(sc, sc_d));
    SPW_TRY(s.upload(iota, ids));
    SPW_TRY(engram_gather_cuda(q_d.get(), sc_d.get(), ids.get(), int64_t(N), hd, rows.get(), s.stream));
  } else {
    SPW_TRY(s.upload(row_ids, ids));
    SPW_TRY(engram_gather_cuda(static_cast<const uint8_t*>(tables.table.device_ptr()),
                               static_cast<const uint8_t*>(tables.scale.device_ptr()), ids.get(), int64_t(n) * n_rows,
                               hd, rows.get(), s.stream));
  }
  // [n, (hc+1)·d]: hc keys and one value.
  SPW_TRY(linear(s, s.w.layers[layer].engram_wkv, rows.get(), n, kv.get()));
  SPW_TRY(mute_engram_values(s, kv.get()));  // image positions: nothing to add
  // The gate per residual copy, streams [n, hc, d] updated in place.
  return engram_gate_cuda(streams, kv.get(), tables.qk.get(), n, hc, d, c.norm_eps, s.num.bf16_activations, s.stream);
}

}  // namespace spw::engine
