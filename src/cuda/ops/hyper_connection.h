// mHC (manifold-constrained hyper-connections) on the GPU, specs §3 "mHC coefficients";
// twins of ops/ref/hyper_connection.h, batched over tokens. The residual stream of a token holds
// hc copies of the hidden vector: X [hc, d], flattened index = copy·d + channel.
//
// Contract (device pointers, f32, per token t):
//   hc_mixes:          mixes[t, o] = (fn[o, :] · X_t) · rsqrt(mean(X_t²) + norm_eps), o < n_out;
//                      x_streams [n_tokens, hc_d], fn [n_out, hc_d].
//   hc_split_sinkhorn: from mixes [n_tokens, (2+hc)·hc] and the layer's scale [3], base [(2+hc)·hc]
//                      (device) to pre [n_tokens, hc], post [n_tokens, hc], comb [n_tokens, hc, hc]
//                      (comb[j·hc + k], expand sums over j), with sinkhorn_iters normalisations.
//   hc_head_pre:       V4's head collapse weights (model.cpp): pre[t, j] = σ(mixes[t, j]·scale[0] +
//                      base[j]) + hc_eps from the head's mixes [n_tokens, hc] (hc_mixes with n_out = hc).
//   hc_collapse:       y[t] = Σ_j pre[t, j] · X_t[j]; y [n_tokens, d]; round_out rounds y to bf16.
//   hc_expand:         X_t[k] ← post[t, k]·y[t] + Σ_j comb[t, j, k]·X_t[j], in place on x_streams
//                      [n_tokens, hc, d]; round_out rounds the new streams to bf16 (model.cpp expand()).
// Accuracy:
//   hc_collapse, hc_expand: bit-exact (the reference's f32 operation order, no FMA).
//   hc_split_sinkhorn, hc_head_pre: the reference's operations in its order per token; bit-exact
//     except where glibc's expf is off by an ulp (exp here is the f64 value rounded once); tests
//     allow 2e-6 relative.
//   hc_mixes: mean(X²) in f64 as the reference (bit-exact inverse norm except rare f64 ties); the dot
//     products sum in a tree order in f32 where the reference sums sequentially, so the difference is
//     the reference's own rounding error: tests allow 4e-6 · rsqrt(·) · Σ|fn·X|.
// Limits: hc ≤ 8 (V4 and V4.1 use 4); n_tokens < 2^31, n_out ≤ 131070.
// Speed: hc_mixes is a per-token GEMV (fn re-read from L2 for every token); for long prefill chunks
// a GEMM over tokens would read fn once. The other three are memory-bound element-wise passes.
// Tests: tests/gpu/test_cuda_ops_hc.cpp (the fused forms against the separate launches too).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::cuda {

constexpr int kHcMax = 8;

Status hc_mixes(const float* x_streams, const float* fn, int64_t n_tokens, int n_out, int64_t hc_d, float norm_eps,
                float* mixes, cudaStream_t stream);

Status hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int64_t n_tokens, int hc,
                         int sinkhorn_iters, float hc_eps, float* pre, float* post, float* comb, cudaStream_t stream);

Status hc_head_pre(const float* mixes, const float* scale, const float* base, int64_t n_tokens, int hc, float hc_eps,
                   float* pre, cudaStream_t stream);

Status hc_collapse(const float* x_streams, const float* pre, int64_t n_tokens, int hc, int64_t d, bool round_out,
                   float* y, cudaStream_t stream);

Status hc_expand(float* x_streams, const float* y, const float* post, const float* comb, int64_t n_tokens, int hc,
                 int64_t d, bool round_out, cudaStream_t stream);

// Fused forms for a decode step (hc_fused.cu), bit-identical to the separate launches; hc 2 or 4 only
// (hc_fused_supported), n_tokens ≤ 65535.
//   hc_collapse_norm:   y[t] = rms_norm(Σ_j pre[t, j]·X_t[j], norm_w), round_out rounding after the collapse and
//                       after the norm — hc_collapse then rms_norm. pre is given, or (from) computed from the
//                       mixes as hc_split_sinkhorn / hc_head_pre do (pre_j = σ(mix_j·scale₀ + base_j) + eps).
//   hc_expand_sinkhorn: hc_split_sinkhorn of from's mixes, then hc_expand with its post and comb; pre_out (may
//                       be null) receives its pre. The mixes must have been written two or more launches before
//                       this one on the stream (it reads them before waiting on the previous kernel).
// The mixes of token t start at mixes + t·mix_stride.
struct HcPreFromMixes {
  const float* mixes = nullptr;
  int64_t mix_stride = 0;
  const float* scale = nullptr;
  const float* base = nullptr;
  float hc_eps = 0.f;
};
bool hc_fused_supported(int hc);
Status hc_collapse_norm(const float* x_streams, const float* pre, const HcPreFromMixes* from, const float* norm_w,
                        int64_t n_tokens, int hc, int64_t d, float norm_eps, bool round_out, float* y,
                        cudaStream_t stream);
Status hc_expand_sinkhorn(float* x_streams, const float* y, const HcPreFromMixes& from, int sinkhorn_iters,
                          int64_t n_tokens, int hc, int64_t d, bool round_out, float* pre_out, cudaStream_t stream);

}  // namespace spw::cuda
