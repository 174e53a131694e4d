// Device pieces of the mHC kernels shared by hyper_connection.cu and hc_fused.cu: the reference's
// unfused multiply-add and the small-hc split + Sinkhorn of one token by one warp.
#pragma once

#include <cuda_runtime.h>

#include "cuda/ops/device_numerics.cuh"

namespace spw::cuda::hcdev {

// a·b + c rounded twice, as the reference computes it without FMA.
__device__ __forceinline__ float mul_add(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }

// One token's coefficients from its mixes [(2+HC)·HC] (hc² ≤ 32: V4 and V4.1 have hc = 4), by a whole warp:
// lane j < HC gets pre_j = σ(mix_j·scale₀ + base_j) + eps and post_j = 2σ(mix_{HC+j}·scale₁ + base_{HC+j}); lane
// e = j·HC + k < HC² gets comb[j, k] after sinkhorn_iters normalisations, with the matrix in registers and each
// row / column sum gathered by shuffles in the reference's order (0 + m₀ + m₁ + ...). `mixes` may come from
// another kernel of the grid's stream two or more launches back: it is read through L2 (ld.cg).
template <int HC>
__device__ __forceinline__ void split_sinkhorn_warp(const float* mixes, const float* scale, const float* base,
                                                    int sinkhorn_iters, float hc_eps, int lane, float& pre,
                                                    float& post, float& comb) {
  static_assert(HC * HC <= 32);
  constexpr int nn = HC * HC;
  const int e = lane < nn ? lane : 0;  // this lane's element (lanes ≥ nn compute on a copy)
  const int j = lane < HC ? lane : 0;
  pre = __fadd_rn(dev::sigmoid(mul_add(__ldcg(mixes + j), scale[0], base[j])), hc_eps);
  post = 2.0f * dev::sigmoid(mul_add(__ldcg(mixes + HC + j), scale[1], base[HC + j]));
  // Softmax over k of row j: max, then Σ exp in k order, then exp / Σ + eps.
  float m = mul_add(__ldcg(mixes + 2 * HC + e), scale[2], base[2 * HC + e]);
  const int row0 = (e / HC) * HC, col = e % HC;
  float mx = -INFINITY;
#pragma unroll
  for (int kk = 0; kk < HC; ++kk) mx = fmaxf(mx, __shfl_sync(0xffffffffu, m, row0 + kk));
  m = dev::exp_f32(m - mx);
  float sum = 0.f;
#pragma unroll
  for (int kk = 0; kk < HC; ++kk) sum += __shfl_sync(0xffffffffu, m, row0 + kk);
  m = m / sum + hc_eps;
  for (int it = 0; it < sinkhorn_iters; ++it) {
    if (it > 0) {  // rows (the first pass normalises columns only)
      float s = 0.f;
#pragma unroll
      for (int kk = 0; kk < HC; ++kk) s += __shfl_sync(0xffffffffu, m, row0 + kk);
      m /= (s + hc_eps);
    }
    float s = 0.f;
#pragma unroll
    for (int jj = 0; jj < HC; ++jj) s += __shfl_sync(0xffffffffu, m, jj * HC + col);
    m /= (s + hc_eps);
  }
  comb = m;
}

}  // namespace spw::cuda::hcdev
