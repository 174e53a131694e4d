// mHC (manifold-constrained hyper-connections), specs §3 "mHC coefficients".
// The residual stream holds hc copies of the hidden vector: X [hc, d].
#pragma once

#include <cstddef>
#include <vector>

namespace spw::ref {

struct HcCoefficients {
  std::vector<float> pre;   // [hc]
  std::vector<float> post;  // [hc]
  std::vector<float> comb;  // [hc, hc], comb[j*hc + k]; expand sums over j (the first index)
};

// mixes: the (2+hc)·hc values W_fn·x̄ · rsqrt(mean(x̄²)+eps), already computed by the caller.
// scale [3], base [(2+hc)·hc] are the layer's hc_*_scale / hc_*_base.
HcCoefficients hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int hc,
                                 int sinkhorn_iters, float hc_eps);

// mixes[n_out] = (fn[n_out, hc·d] · flatten(X)) · rsqrt(mean(flatten(X)²) + norm_eps), f32.
void hc_mixes(const float* x_streams, const float* fn, size_t n_out, size_t hc_d, float norm_eps, float* mixes);

// y[d] = Σ_j pre_j · X_j.
void hc_collapse(const float* x_streams, const float* pre, int hc, size_t d, float* y);

// X'_k = post_k · y + Σ_j comb[j,k] · X_j, in place on X (x_streams [hc, d]).
void hc_expand(float* x_streams, const float* y, const float* post, const float* comb, int hc, size_t d);

}  // namespace spw::ref
