#include "ops/ref/moe.h"

#include <algorithm>
#include <cmath>

#include "ops/ref/linalg.h"

namespace spw::ref {

void sqrtsoftplus(const float* logits, float* scores, size_t n) {
  for (size_t i = 0; i < n; ++i) scores[i] = std::sqrt(softplus(logits[i]));
}

void route_weights(const float* scores, const int32_t* idx, size_t top_k, float norm_eps, float route_scale,
                   float* weights) {
  float sum = 0.f;
  for (size_t i = 0; i < top_k; ++i) sum += scores[idx[i]];
  for (size_t i = 0; i < top_k; ++i) weights[i] = scores[idx[i]] / (sum + norm_eps) * route_scale;
}

void swiglu(const float* g, const float* u, float* h, size_t n, float limit, float weight) {
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i], ui = u[i];
    if (limit > 0) {
      gi = std::min(gi, limit);
      ui = std::clamp(ui, -limit, limit);
    }
    h[i] = silu(gi) * ui * weight;
  }
}

}  // namespace spw::ref
