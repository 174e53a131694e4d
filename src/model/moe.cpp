// MoE sublayer in four stages (docs/STYLE.md rule 4): router → dispatch → experts → combine,
// plus the shared expert (specs §4.6, §5.3).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/thread_pool.h"
#include "formats/quant.h"
#include "model/forward_context.h"
#include "ops/ref/linalg.h"
#include "ops/ref/moe.h"
#include "ops/ref/topk.h"

namespace spw::detail {
namespace {

struct Routing {
  std::vector<int32_t> experts;  // [n, top_k]
  std::vector<float> weights;    // [n, top_k]
};

Routing route(const ForwardContext& s, const LayerWeights& lw, bool hash_routed, const float* x) {
  const ModelConfig& c = s.c;
  const int n = s.n, E = c.n_experts, K = c.top_k;
  std::vector<float> logits(size_t(n) * E), scores(size_t(n) * E), biased(E);
  linear(s, lw.gate, x, n, logits.data());  // [n, E] f32
  ref::sqrtsoftplus(logits.data(), scores.data(), logits.size());
  Routing r{std::vector<int32_t>(size_t(n) * K), std::vector<float>(size_t(n) * K)};
  for (int i = 0; i < n; ++i) {
    const float* si = scores.data() + size_t(i) * E;
    int32_t* idx = r.experts.data() + size_t(i) * K;
    if (hash_routed) {
      std::memcpy(idx, lw.tid2eid.data() + size_t(s.tokens[i]) * K, sizeof(int32_t) * K);
    } else {
      // The bias only selects; weights come from the unbiased scores. Image positions use V4.1's bias_vl.
      const std::vector<float>& bias = is_image_position(s, i) ? lw.gate_bias_vl : lw.gate_bias;
      for (int e = 0; e < E; ++e) biased[e] = si[e] + bias[e];
      auto top = ref::topk_indices(biased.data(), E, K);
      std::copy(top.begin(), top.end(), idx);
    }
    ref::route_weights(si, idx, K, c.is_v41() ? 1e-20f : 0.f, c.route_scale, r.weights.data() + size_t(i) * K);
  }
  return r;
}

// One expert on the tokens routed to it: w2 · (silu(min(w1·x, L)) · clamp(w3·x, ±L) · weight).
// The reference's Expert.forward: gate and up are bf16 linear outputs widened to f32, the hidden
// is rounded to bf16 before the down projection, whose bf16 output the caller accumulates in f32.
void run_expert(const ForwardContext& s, const Expert& e, const std::vector<float>& xs,
                const std::vector<float>& weights, float limit, std::vector<float>& ys) {
  const int m = int(weights.size()), F = e.w1.n_out, d = e.w2.n_out;
  std::vector<float> g(size_t(m) * F), u(size_t(m) * F), h(size_t(m) * F);
  linear(s, e.w1, xs.data(), m, g.data());
  linear(s, e.w3, xs.data(), m, u.data());
  for (int j = 0; j < m; ++j)
    ref::swiglu(g.data() + size_t(j) * F, u.data() + size_t(j) * F, h.data() + size_t(j) * F, F, limit, weights[j]);
  to_activation(s, h.data(), h.size());
  ys.resize(size_t(m) * d);
  linear(s, e.w2, h.data(), m, ys.data());
}

}  // namespace

Status moe_many(std::span<ForwardContext* const> contexts, int layer, std::span<const float* const> x,
                std::span<float* const> out) {
  const ForwardContext& s0 = *contexts[0];
  const ModelConfig& c = s0.c;
  const LayerWeights& lw = s0.w.layers[layer];
  const int d = c.d_model, K = c.top_k, E = c.n_experts;
  const size_t n_contexts = contexts.size();

  // Router, per context: [n, top_k] experts and weights.
  std::vector<Routing> routing(n_contexts);
  for (size_t i = 0; i < n_contexts; ++i) {
    const ForwardContext& s = *contexts[i];
    routing[i] = route(s, lw, c.layers[layer].hash_routed, x[i]);
    if (s.options && s.options->routing_counts) {
      RoutingCounts& rc = *s.options->routing_counts;
      if (layer == 0) rc.n_tokens += s.n;
      for (int32_t e : routing[i].experts) ++rc.counts[size_t(layer)][size_t(e)];
    }
    if (s.options && s.options->on_intermediate) {
      const std::vector<float> ids(routing[i].experts.begin(), routing[i].experts.end());
      dump(s, "moe.experts", layer, ids.data(), ids.size());
      dump(s, "moe.weights", layer, routing[i].weights.data(), routing[i].weights.size());
    }
  }

  // Dispatch: each expert's (context, token, weight), contexts then tokens in order.
  struct Slot {
    size_t context;
    int token;
    float weight;
  };
  std::vector<std::vector<Slot>> slots(E);
  std::vector<std::vector<float>> acc(n_contexts);
  for (size_t i = 0; i < n_contexts; ++i) {
    const int n = contexts[i]->n;
    acc[i].assign(size_t(n) * d, 0.f);
    for (int t = 0; t < n; ++t)
      for (int k = 0; k < K; ++k)
        slots[routing[i].experts[size_t(t) * K + k]].push_back({i, t, routing[i].weights[size_t(t) * K + k]});
  }

  // Experts in index order, so every token sums its experts' outputs in the order one context alone would (f32
  // accumulation). A layer loaded without routed-expert values (LoadOptions::routed_expert_values) has each used
  // expert dequantized from the checkpoint, a pool's worth at a time in parallel, and freed after use. A rank of
  // an expert-parallel group runs only its own experts (RankRole).
  const RankRole& role = *s0.role;
  const int e_first = std::max(0, role.expert_begin), e_last = std::min(E, role.expert_end);
  const size_t batch = global_pool().size();
  std::vector<Expert> loaded(batch);
  std::vector<Status> load_status(batch);
  std::vector<float> xs, ys, weights;
  for (int e0 = e_first; e0 < e_last; e0 += int(batch)) {
    const int e1 = std::min(e_last, e0 + int(batch));
    global_pool().parallel_for(size_t(e1 - e0), [&](size_t b, size_t end) {
      for (size_t j = b; j < end; ++j) {
        const int e = e0 + int(j);
        loaded[j] = Expert{};
        load_status[j] = {};
        if (slots[e].empty() || !lw.experts[e].w1.empty()) continue;
        auto r = load_routed_expert(s0.w, c, layer, e);
        if (r.ok()) loaded[j] = std::move(r.value());
        else load_status[j] = r.error();
      }
    });
    for (int e = e0; e < e1; ++e) {
      if (slots[e].empty()) continue;
      SPW_TRY(load_status[size_t(e - e0)]);
      const Expert& ex = lw.experts[e].w1.empty() ? loaded[size_t(e - e0)] : lw.experts[e];
      xs.resize(slots[e].size() * d);
      weights.resize(slots[e].size());
      for (size_t j = 0; j < slots[e].size(); ++j) {
        const Slot& sl = slots[e][j];
        std::memcpy(xs.data() + j * d, x[sl.context] + size_t(sl.token) * d, sizeof(float) * d);
        weights[j] = sl.weight;
      }
      run_expert(s0, ex, xs, weights, c.swiglu_limit, ys);
      for (size_t j = 0; j < slots[e].size(); ++j) {
        float* a = acc[slots[e][j].context].data() + size_t(slots[e][j].token) * d;
        for (int k = 0; k < d; ++k) a[k] += ys[j * d + k];
      }
    }
  }

  // Shared expert: clamped in V4.1 only. In a parallel group (RankRole::comm) acc is this rank's part of the
  // routed sum, and the ranks' parts are added before the bf16 rounding; a shared expert whole on every rank is
  // added once, after that sum.
  const bool shared_after_sum = role.comm && !role.shared_split;
  for (size_t i = 0; i < n_contexts; ++i) {
    ForwardContext& s = *contexts[i];
    const int n = s.n;
    const size_t count = acc[i].size();
    std::vector<float> xall(x[i], x[i] + size_t(n) * d), ones(n, 1.0f), shared;
    run_expert(s, lw.shared, xall, ones, c.is_v41() ? c.swiglu_limit : 0.f, shared);
    dump(s, "moe.routed", layer, acc[i].data(), count);
    dump(s, "moe.shared", layer, shared.data(), shared.size());
    for (size_t j = 0; j < count; ++j) out[i][j] = shared_after_sum ? acc[i][j] : acc[i][j] + shared[j];
    if (role.comm) {
      SPW_TRY(all_reduce_ranks(role, out[i], count));
      if (shared_after_sum)
        for (size_t j = 0; j < count; ++j) out[i][j] += shared[j];
    }
    to_activation(s, out[i], count);
  }
  return {};
}

}  // namespace spw::detail
