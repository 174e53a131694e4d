// MoE sublayer in four stages (docs/STYLE.md rule 4): router → dispatch → experts → combine,
// plus the shared expert (specs §4.6, §5.3).
#include <cmath>
#include <cstring>

#include "formats/quant.h"
#include "model/step.h"
#include "ops/ref/linalg.h"
#include "ops/ref/moe.h"
#include "ops/ref/topk.h"

namespace spw::detail {
namespace {

struct Routing {
  std::vector<int32_t> experts;  // [n, top_k]
  std::vector<float> weights;    // [n, top_k]
};

Routing route(const Step& s, const LayerWeights& lw, bool hash_routed, const float* x) {
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
      // The bias only selects; weights come from the unbiased scores. Text tokens use `bias`
      // (image tokens would use V4.1's bias_vl).
      for (int e = 0; e < E; ++e) biased[e] = si[e] + lw.gate_bias[e];
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
void run_expert(const Step& s, const Expert& e, const std::vector<float>& xs, const std::vector<float>& weights,
                float limit, std::vector<float>& ys) {
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

void moe(Step& s, int layer, const float* x, float* out) {
  const ModelConfig& c = s.c;
  const LayerWeights& lw = s.w.layers[layer];
  const int n = s.n, d = c.d_model, K = c.top_k;

  // Router: [n, top_k] experts and weights.
  Routing routing = route(s, lw, c.layers[layer].hash_routed, x);
  if (s.options && s.options->on_intermediate) {
    const std::vector<float> ids(routing.experts.begin(), routing.experts.end());
    dump(s, "moe.experts", layer, ids.data(), ids.size());
    dump(s, "moe.weights", layer, routing.weights.data(), routing.weights.size());
  }

  // Dispatch: the tokens of each expert, then the experts, then combine (f32 accumulation).
  std::vector<float> acc(size_t(n) * d, 0.f);
  std::vector<std::vector<int>> tokens_of(c.n_experts);
  std::vector<std::vector<float>> weights_of(c.n_experts);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < K; ++k) {
      tokens_of[routing.experts[size_t(i) * K + k]].push_back(i);
      weights_of[routing.experts[size_t(i) * K + k]].push_back(routing.weights[size_t(i) * K + k]);
    }
  std::vector<float> xs, ys;
  for (int e = 0; e < c.n_experts; ++e) {
    if (tokens_of[e].empty()) continue;
    xs.resize(tokens_of[e].size() * d);
    for (size_t j = 0; j < tokens_of[e].size(); ++j)
      std::memcpy(xs.data() + j * d, x + size_t(tokens_of[e][j]) * d, sizeof(float) * d);
    run_expert(s, lw.experts[e], xs, weights_of[e], c.swiglu_limit, ys);
    for (size_t j = 0; j < tokens_of[e].size(); ++j)
      for (int k = 0; k < d; ++k) acc[size_t(tokens_of[e][j]) * d + k] += ys[j * d + k];
  }

  // Shared expert: clamped in V4.1 only.
  std::vector<float> xall(x, x + size_t(n) * d), ones(n, 1.0f), shared;
  run_expert(s, lw.shared, xall, ones, c.is_v41() ? c.swiglu_limit : 0.f, shared);
  dump(s, "moe.routed", layer, acc.data(), acc.size());
  dump(s, "moe.shared", layer, shared.data(), shared.size());
  for (size_t i = 0; i < acc.size(); ++i) out[i] = acc[i] + shared[i];
  to_activation(s, out, acc.size());
}

}  // namespace spw::detail
