// MoE building blocks: the sqrtsoftplus router and the clamped SwiGLU (specs §4.6, §5.3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spw::ref {

// scores[i] = sqrt(softplus(logits[i])).
void sqrtsoftplus(const float* logits, float* scores, size_t n);

// Routing weights for chosen experts: w_i = s[idx_i] / (Σ s[idx] + norm_eps) · route_scale.
void route_weights(const float* scores, const int32_t* idx, size_t top_k, float norm_eps, float route_scale,
                   float* weights);

// h[i] = silu(min(g, limit)) · clamp(u, ±limit) · weight; limit <= 0 means no clamp.
void swiglu(const float* g, const float* u, float* h, size_t n, float limit, float weight);

}  // namespace spw::ref
