// The MoE router and the clamped SwiGLU on the GPU: model/moe.cpp route() and ops/ref/moe.h.
//
// router_topk: per token t, scores = sqrt(softplus(logits[t])) (ref::sqrtsoftplus); experts[t] =
//   the top_k of scores + bias in descending order, ties to the lower expert id (ref::topk_indices);
//   weights[t, k] = s[e_k] / (Σ_k s[e_k] + norm_eps) · route_scale, summed in that order
//   (ref::route_weights; V4.1 norm_eps 1e-20, V4 0). The bias only selects.
// router_hash: the same weights for experts[t] = tid2eid[tokens[t]] (hash-routed layers).
// Contract: logits [n_tokens, n_experts] f32, bias [n_experts] f32, tokens [n_tokens] int32,
//   tid2eid [vocab, top_k] int32, all on the device; experts [n_tokens, top_k] int32 and
//   weights [n_tokens, top_k] f32 are overwritten. Logits are finite; token ids in range (the model
//   validates them on the host).
// swiglu: h[r, i] = silu(min(g, limit)) · clamp(u, ±limit) · row_weight[r] (ref::swiglu; limit ≤ 0:
//   no clamp; row_weights null: weight 1); g [n_rows, g_stride], u [n_rows, u_stride] (so a fused
//   gate|up output [n_rows, 2n] is g = gu, u = gu + n, strides 2n), h [n_rows, n]; round_out rounds h
//   to bf16 (the reference's to_activation before the down projection). h may alias g only when
//   g_stride == n.
// Accuracy: softplus/silu use exp/log1p evaluated in f64 and rounded once, glibc's expf/log1pf
//   nearly always give the same f32 (device_numerics.cuh), so scores, weights and h are bit-exact
//   except for such rare 1-ulp cases: tests allow 4·FLT_EPSILON relative and require the expert
//   ids to match exactly.
// Limits: top_k ≤ n_experts ≤ 4096 (scores live in shared memory).
// Tests: tests/gpu/test_cuda_ops_router.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::cuda {

Status router_topk(const float* logits, const float* bias, int64_t n_tokens, int n_experts, int top_k, float norm_eps,
                   float route_scale, int32_t* experts, float* weights, cudaStream_t stream);

Status router_hash(const float* logits, const int32_t* tokens, const int32_t* tid2eid, int64_t n_tokens,
                   int n_experts, int top_k, float norm_eps, float route_scale, int32_t* experts, float* weights,
                   cudaStream_t stream);

Status swiglu(const float* g, int64_t g_stride, const float* u, int64_t u_stride, const float* row_weights,
              int64_t n_rows, int64_t n, float limit, bool round_out, float* h, cudaStream_t stream);

}  // namespace spw::cuda
