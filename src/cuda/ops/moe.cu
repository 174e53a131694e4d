// Router and SwiGLU kernels (contract in moe.h).
//   router: one block per token; scores (and biased scores) in shared memory; then one warp runs top_k rounds
//     of a warp argmax that skips the experts already chosen (ties to the lower index, as ref::topk_indices);
//     thread 0 forms the weights in order. The selection is exact, so it does not depend on how the argmax is
//     reduced: rounds of a block-wide argmax (two barriers each) made this kernel ~10 µs per V4.1 decode layer.
//   swiglu: one thread per element.
#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/moe.h"
#include "cuda/launch.h"

namespace spw::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxExperts = 4096;
constexpr int kMaxTopK = 64;

// bias != nullptr: biased top-k; else experts from tid2eid[tokens[t]].
__global__ void __launch_bounds__(kThreads)
    router_kernel(const float* logits, const float* bias, const int32_t* tokens, const int32_t* tid2eid,
                  int n_experts, int top_k, float norm_eps, float route_scale, int32_t* experts, float* weights) {
  pdl_enter();
  extern __shared__ float smem[];
  float* scores = smem;                  // [n_experts]
  float* biased = smem + n_experts;      // [n_experts]
  __shared__ int chosen[kMaxTopK];
  __shared__ unsigned char taken[kMaxExperts];  // by the selecting warp
  const int64_t t = blockIdx.x;
  const float* lt = logits + t * n_experts;
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    const float s = sqrtf(dev::softplus(lt[e]));
    scores[e] = s;
    if (bias) biased[e] = s + bias[e];
  }
  __syncthreads();
  if (bias) {
    if (threadIdx.x < 32) {  // warp 0 alone: no block barriers between the rounds
      const int lane = threadIdx.x;
      for (int e = lane; e < n_experts; e += 32) taken[e] = 0;
      __syncwarp();
      for (int k = 0; k < top_k; ++k) {
        float bv = -INFINITY;
        int bi = INT32_MAX;
        for (int e = lane; e < n_experts; e += 32)
          if (!taken[e] && dev::better(biased[e], e, bv, bi)) bv = biased[e], bi = e;
        for (int o = 16; o > 0; o >>= 1) {
          const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
          const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
          if (dev::better(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (lane == 0) {
          chosen[k] = bi;
          if (bi < n_experts) taken[bi] = 1;
        }
        __syncwarp();
      }
    }
  } else if (threadIdx.x == 0) {
    for (int k = 0; k < top_k; ++k) chosen[k] = tid2eid[int64_t(tokens[t]) * top_k + k];
  }
  if (threadIdx.x != 0) return;
  float sum = 0.f;
  for (int k = 0; k < top_k; ++k) sum += scores[chosen[k]];
  for (int k = 0; k < top_k; ++k) {
    experts[t * top_k + k] = chosen[k];
    weights[t * top_k + k] = scores[chosen[k]] / (sum + norm_eps) * route_scale;
  }
}

Status launch_router(const char* op, const float* logits, const float* bias, const int32_t* tokens,
                     const int32_t* tid2eid, int64_t n_tokens, int n_experts, int top_k, float norm_eps,
                     float route_scale, int32_t* experts, float* weights, cudaStream_t stream) {
  if (n_experts <= 0 || n_experts > kMaxExperts || top_k <= 0 || top_k > n_experts || top_k > kMaxTopK)
    return make_error(op, ": ", n_experts, " experts, top_k ", top_k, " (supported: top_k ≤ ", kMaxTopK,
                      ", top_k ≤ experts ≤ ", kMaxExperts, ")");
  if (n_tokens <= 0) return {};
  if (n_tokens > INT32_MAX) return make_error(op, ": ", n_tokens, " tokens exceed one grid dimension");
  const size_t smem = sizeof(float) * 2 * n_experts;
  launch(router_kernel, unsigned(n_tokens), kThreads, smem, stream, logits, bias, tokens, tid2eid, n_experts, top_k,
                                                                norm_eps, route_scale, experts, weights);
  return launch_status(op);
}

__global__ void swiglu_kernel(const float* g, int64_t g_stride, const float* u, int64_t u_stride,
                              const float* row_weights, int64_t n_rows, int64_t n, float limit, bool round_out,
                              float* h) {
  pdl_enter();
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_rows * n) return;
  const int64_t r = job / n, i = job % n;
  float gi = g[r * g_stride + i], ui = u[r * u_stride + i];
  if (limit > 0) {
    gi = dev::min_std(gi, limit);
    ui = dev::clamp_std(ui, -limit, limit);
  }
  const float v = dev::silu(gi) * ui * (row_weights ? row_weights[r] : 1.0f);
  h[job] = round_out ? dev::round_bf16(v) : v;
}

}  // namespace

Status router_topk(const float* logits, const float* bias, int64_t n_tokens, int n_experts, int top_k, float norm_eps,
                   float route_scale, int32_t* experts, float* weights, cudaStream_t stream) {
  if (bias == nullptr) return make_error("router_topk: the selection bias is required");
  return launch_router("router_topk", logits, bias, nullptr, nullptr, n_tokens, n_experts, top_k, norm_eps,
                       route_scale, experts, weights, stream);
}

Status router_hash(const float* logits, const int32_t* tokens, const int32_t* tid2eid, int64_t n_tokens,
                   int n_experts, int top_k, float norm_eps, float route_scale, int32_t* experts, float* weights,
                   cudaStream_t stream) {
  if (tokens == nullptr || tid2eid == nullptr) return make_error("router_hash: tokens and tid2eid are required");
  return launch_router("router_hash", logits, nullptr, tokens, tid2eid, n_tokens, n_experts, top_k, norm_eps,
                       route_scale, experts, weights, stream);
}

Status swiglu(const float* g, int64_t g_stride, const float* u, int64_t u_stride, const float* row_weights,
              int64_t n_rows, int64_t n, float limit, bool round_out, float* h, cudaStream_t stream) {
  if (n <= 0 || g_stride < n || u_stride < n)
    return make_error("swiglu: width ", n, " with strides ", g_stride, ", ", u_stride);
  if (n_rows <= 0) return {};
  launch(swiglu_kernel, grid_for(n_rows * n, 256), 256, 0, stream, g, g_stride, u, u_stride, row_weights, n_rows, n, limit,
                                                                round_out, h);
  return launch_status("swiglu_kernel");
}

}  // namespace spw::cuda
