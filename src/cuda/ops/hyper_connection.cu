// mHC kernels (contract in hyper_connection.h).
//   hc_mixes: grid (token, group of 8 outputs): the block sums X² in f64 (each group again, so that a
//     decode token spreads over several SMs), then each warp reduces one output's dot product.
//   hc_split_sinkhorn: one thread per token, the reference's loops verbatim (hc·hc ≤ 64 registers).
//   hc_head_pre: one thread per (token, stream).
//   hc_collapse / hc_expand: one thread per (token, channel), all hc streams of that channel.
#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/hyper_connection.h"

namespace spw::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    hc_mixes_kernel(const float* x_streams, const float* fn, int n_out, int64_t hc_d, float norm_eps, float* mixes) {
  __shared__ double scratch[32];
  const float* x = x_streams + int64_t(blockIdx.x) * hc_d;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < hc_d; i += blockDim.x) ss += double(x[i]) * x[i];
  ss = dev::block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(float(ss / double(hc_d)) + norm_eps);
  // Block (t, y) owns outputs y·n_warps + warp, stepping over the whole grid's warps.
  const int lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  for (int o = blockIdx.y * n_warps + (threadIdx.x >> 5); o < n_out; o += n_warps * gridDim.y) {
    const float* w = fn + int64_t(o) * hc_d;
    float acc = 0.f;
    for (int64_t i = lane; i < hc_d; i += 32) acc += w[i] * x[i];
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) mixes[int64_t(blockIdx.x) * n_out + o] = acc * inv;
  }
}

// a·b + c rounded twice, as the reference computes it without FMA.
__device__ inline float mul_add(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }

__global__ void hc_split_sinkhorn_kernel(const float* mixes_all, const float* scale, const float* base,
                                         int64_t n_tokens, int hc, int sinkhorn_iters, float hc_eps, float* pre,
                                         float* post, float* comb) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_tokens) return;
  const float* mixes = mixes_all + t * (2 + hc) * hc;
  for (int j = 0; j < hc; ++j) {
    pre[t * hc + j] = __fadd_rn(dev::sigmoid(mul_add(mixes[j], scale[0], base[j])), hc_eps);
    post[t * hc + j] = 2.0f * dev::sigmoid(mul_add(mixes[hc + j], scale[1], base[hc + j]));
  }
  float m[kHcMax * kHcMax];
  for (int j = 0; j < hc; ++j) {  // softmax over k for each row j
    float mx = -INFINITY;
    for (int k = 0; k < hc; ++k) {
      m[j * hc + k] = mul_add(mixes[2 * hc + j * hc + k], scale[2], base[2 * hc + j * hc + k]);
      mx = fmaxf(mx, m[j * hc + k]);
    }
    float sum = 0.f;
    for (int k = 0; k < hc; ++k) sum += (m[j * hc + k] = dev::exp_f32(m[j * hc + k] - mx));
    for (int k = 0; k < hc; ++k) m[j * hc + k] = m[j * hc + k] / sum + hc_eps;
  }
  for (int it = 0; it < sinkhorn_iters; ++it) {
    if (it > 0) {  // rows, then columns; the first pass normalises columns only
      for (int j = 0; j < hc; ++j) {
        float s = 0.f;
        for (int k = 0; k < hc; ++k) s += m[j * hc + k];
        for (int k = 0; k < hc; ++k) m[j * hc + k] /= (s + hc_eps);
      }
    }
    for (int k = 0; k < hc; ++k) {
      float s = 0.f;
      for (int j = 0; j < hc; ++j) s += m[j * hc + k];
      for (int j = 0; j < hc; ++j) m[j * hc + k] /= (s + hc_eps);
    }
  }
  for (int i = 0; i < hc * hc; ++i) comb[t * hc * hc + i] = m[i];
}

__global__ void hc_head_pre_kernel(const float* mixes, const float* scale, const float* base, int64_t n_tokens,
                                   int hc, float hc_eps, float* pre) {
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_tokens * hc) return;
  pre[job] = __fadd_rn(dev::sigmoid(mul_add(mixes[job], scale[0], base[job % hc])), hc_eps);
}

__global__ void hc_collapse_kernel(const float* x_streams, const float* pre, int64_t n_tokens, int hc, int64_t d,
                                   bool round_out, float* y) {
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_tokens * d) return;
  const int64_t t = job / d, i = job % d;
  const float* x = x_streams + t * hc * d + i;
  float acc = 0.f;
  for (int j = 0; j < hc; ++j) acc = mul_add(pre[t * hc + j], x[j * d], acc);
  y[job] = round_out ? dev::round_bf16(acc) : acc;
}

__global__ void hc_expand_kernel(float* x_streams, const float* y, const float* post, const float* comb,
                                 int64_t n_tokens, int hc, int64_t d, bool round_out) {
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_tokens * d) return;
  const int64_t t = job / d, i = job % d;
  float* x = x_streams + t * hc * d + i;
  const float* c = comb + t * hc * hc;
  float in[kHcMax];
  for (int j = 0; j < hc; ++j) in[j] = x[j * d];
  for (int k = 0; k < hc; ++k) {
    // Mix first, then add the sublayer output: the reference's order of f32 additions.
    float mixed = 0.f;
    for (int j = 0; j < hc; ++j) mixed = mul_add(c[j * hc + k], in[j], mixed);
    const float v = mul_add(post[t * hc + k], y[job], mixed);
    x[k * d] = round_out ? dev::round_bf16(v) : v;
  }
}

Status check_hc(const char* op, int hc) {
  if (hc <= 0 || hc > kHcMax) return make_error(op, ": hc ", hc, " outside 1..", kHcMax);
  return {};
}

}  // namespace

Status hc_mixes(const float* x_streams, const float* fn, int64_t n_tokens, int n_out, int64_t hc_d, float norm_eps,
                float* mixes, cudaStream_t stream) {
  if (hc_d <= 0 || n_out <= 0) return make_error("hc_mixes: hc_d ", hc_d, " and n_out ", n_out, " must be positive");
  if (n_tokens <= 0) return {};
  if (n_tokens > INT32_MAX || n_out > 65535 * (kThreads / 32))
    return make_error("hc_mixes: ", n_tokens, " tokens, ", n_out, " outputs exceed the grid");
  const dim3 grid(unsigned(n_tokens), unsigned((n_out + kThreads / 32 - 1) / (kThreads / 32)));
  hc_mixes_kernel<<<grid, kThreads, 0, stream>>>(x_streams, fn, n_out, hc_d, norm_eps, mixes);
  return launch_status("hc_mixes_kernel");
}

Status hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int64_t n_tokens, int hc,
                         int sinkhorn_iters, float hc_eps, float* pre, float* post, float* comb, cudaStream_t stream) {
  SPW_TRY(check_hc("hc_split_sinkhorn", hc));
  if (sinkhorn_iters < 1) return make_error("hc_split_sinkhorn: ", sinkhorn_iters, " iterations (need ≥ 1)");
  if (n_tokens <= 0) return {};
  hc_split_sinkhorn_kernel<<<grid_for(n_tokens, 128), 128, 0, stream>>>(mixes, scale, base, n_tokens, hc,
                                                                        sinkhorn_iters, hc_eps, pre, post, comb);
  return launch_status("hc_split_sinkhorn_kernel");
}

Status hc_head_pre(const float* mixes, const float* scale, const float* base, int64_t n_tokens, int hc, float hc_eps,
                   float* pre, cudaStream_t stream) {
  SPW_TRY(check_hc("hc_head_pre", hc));
  if (n_tokens <= 0) return {};
  hc_head_pre_kernel<<<grid_for(n_tokens * hc, 128), 128, 0, stream>>>(mixes, scale, base, n_tokens, hc, hc_eps, pre);
  return launch_status("hc_head_pre_kernel");
}

Status hc_collapse(const float* x_streams, const float* pre, int64_t n_tokens, int hc, int64_t d, bool round_out,
                   float* y, cudaStream_t stream) {
  SPW_TRY(check_hc("hc_collapse", hc));
  if (n_tokens <= 0 || d <= 0) return {};
  hc_collapse_kernel<<<grid_for(n_tokens * d, kThreads), kThreads, 0, stream>>>(x_streams, pre, n_tokens, hc, d,
                                                                                 round_out, y);
  return launch_status("hc_collapse_kernel");
}

Status hc_expand(float* x_streams, const float* y, const float* post, const float* comb, int64_t n_tokens, int hc,
                 int64_t d, bool round_out, cudaStream_t stream) {
  SPW_TRY(check_hc("hc_expand", hc));
  if (n_tokens <= 0 || d <= 0) return {};
  hc_expand_kernel<<<grid_for(n_tokens * d, kThreads), kThreads, 0, stream>>>(x_streams, y, post, comb, n_tokens, hc,
                                                                               d, round_out);
  return launch_status("hc_expand_kernel");
}

}  // namespace spw::cuda
