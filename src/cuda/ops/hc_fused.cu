// The fused mHC kernels of a decode step (contract in hyper_connection.h):
//   hc_collapse_norm: one 1024-thread block per token: (V4) pre from the mixes by one warp, the collapse
//     Σ_j pre_j·X_j written to y with its squares summed in f64, then the norm over y — rms_norm_kernel's
//     thread striding, block sum and arithmetic, so the result is bit-identical to hc_collapse + rms_norm.
//   hc_expand_sinkhorn: grid (channel blocks, token): warp 0 of every block computes the token's post and
//     comb (hc_device.cuh) into shared memory before the block waits on the previous kernel — the mixes
//     come from two or more launches back, so the Sinkhorn overlaps the previous kernel's tail — then
//     every thread expands its channel as hc_expand_kernel does; block 0 also stores pre.
// Together they replace hc_split_sinkhorn, hc_collapse, rms_norm and hc_expand: five launches per
// sublayer become three (with hc_mixes).
#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/hc_device.cuh"
#include "cuda/ops/hyper_connection.h"
#include "cuda/launch.h"

namespace spw::cuda {
namespace {

using hcdev::mul_add;

constexpr int kNormThreads = 1024;  // rms_norm_kernel's block: the same f64 summation order
constexpr int kExpandThreads = 256;

template <int HC>
__global__ void __launch_bounds__(kNormThreads)
    hc_collapse_norm_kernel(const float* x_streams, const float* pre_given, HcPreFromMixes from, const float* norm_w,
                            int64_t d, float norm_eps, bool round_out, float* y) {
  if (norm_w && blockIdx.x == 0) prefetch_l2(norm_w, size_t(d) * sizeof(float));
  pdl_enter();
  __shared__ double scratch[32];
  __shared__ float pre[HC];
  const int64_t t = blockIdx.x;
  if (pre_given) {
    if (threadIdx.x < HC) pre[threadIdx.x] = pre_given[t * HC + threadIdx.x];
  } else if (threadIdx.x < HC) {  // hc_head_pre / hc_split_sinkhorn's pre
    const int j = threadIdx.x;
    pre[j] = __fadd_rn(dev::sigmoid(mul_add(from.mixes[t * from.mix_stride + j], from.scale[0], from.base[j])),
                       from.hc_eps);
  }
  __syncthreads();
  const float* x = x_streams + t * HC * d;
  float* yr = y + t * d;
  double ss = 0.0;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < HC; ++j) acc = mul_add(pre[j], x[j * d + i], acc);
    if (round_out) acc = dev::round_bf16(acc);
    yr[i] = acc;  // read back below by this thread only
    ss += double(acc) * acc;
  }
  ss = dev::block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(float(ss / double(d)) + norm_eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = (norm_w ? norm_w[i] : 1.0f) * (yr[i] * inv);
    yr[i] = round_out ? dev::round_bf16(v) : v;
  }
}

template <int HC>
__global__ void __launch_bounds__(kExpandThreads)
    hc_expand_sinkhorn_kernel(float* x_streams, const float* y, HcPreFromMixes from, int sinkhorn_iters, int64_t d,
                              bool round_out, float* pre_out) {
  __shared__ float post[HC], comb[HC * HC], pre[HC];
  const int64_t t = blockIdx.y;
  if (threadIdx.x < 32) {  // before the wait: the mixes are older than the previous kernel
    float p, q, c;
    hcdev::split_sinkhorn_warp<HC>(from.mixes + t * from.mix_stride, from.scale, from.base, sinkhorn_iters,
                                   from.hc_eps, threadIdx.x, p, q, c);
    if (threadIdx.x < HC) pre[threadIdx.x] = p, post[threadIdx.x] = q;
    if (threadIdx.x < HC * HC) comb[threadIdx.x] = c;
  }
  __syncthreads();
  pdl_enter();
  if (pre_out && blockIdx.x == 0 && threadIdx.x < HC) pre_out[t * HC + threadIdx.x] = pre[threadIdx.x];
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= d) return;
  float* x = x_streams + t * HC * d + i;
  const float yv = y[t * d + i];
  float in[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) in[j] = x[j * d];
#pragma unroll
  for (int k = 0; k < HC; ++k) {
    // Mix first, then add the sublayer output: the reference's order of f32 additions.
    float mixed = 0.f;
#pragma unroll
    for (int j = 0; j < HC; ++j) mixed = mul_add(comb[j * HC + k], in[j], mixed);
    const float v = mul_add(post[k], yv, mixed);
    x[k * d] = round_out ? dev::round_bf16(v) : v;
  }
}

Status check_fused_hc(const char* op, int hc, int64_t n_tokens, int64_t d) {
  if (!hc_fused_supported(hc)) return make_error(op, ": hc ", hc, " (the fused kernels take 2 or 4)");
  if (d <= 0) return make_error(op, ": width ", d, " must be positive");
  if (n_tokens > 65535) return make_error(op, ": ", n_tokens, " tokens exceed the grid");
  return {};
}

}  // namespace

bool hc_fused_supported(int hc) { return hc == 2 || hc == 4; }

Status hc_collapse_norm(const float* x_streams, const float* pre, const HcPreFromMixes* from, const float* norm_w,
                        int64_t n_tokens, int hc, int64_t d, float norm_eps, bool round_out, float* y,
                        cudaStream_t stream) {
  SPW_TRY(check_fused_hc("hc_collapse_norm", hc, n_tokens, d));
  if ((pre == nullptr) == (from == nullptr)) return make_error("hc_collapse_norm: give pre or the mixes, not both");
  if (n_tokens <= 0) return {};
  const HcPreFromMixes f = from ? *from : HcPreFromMixes{};
  if (hc == 4)
    launch(hc_collapse_norm_kernel<4>, unsigned(n_tokens), kNormThreads, 0, stream, x_streams, pre, f, norm_w, d,
           norm_eps, round_out, y);
  else
    launch(hc_collapse_norm_kernel<2>, unsigned(n_tokens), kNormThreads, 0, stream, x_streams, pre, f, norm_w, d,
           norm_eps, round_out, y);
  return launch_status("hc_collapse_norm_kernel");
}

Status hc_expand_sinkhorn(float* x_streams, const float* y, const HcPreFromMixes& from, int sinkhorn_iters,
                          int64_t n_tokens, int hc, int64_t d, bool round_out, float* pre_out, cudaStream_t stream) {
  SPW_TRY(check_fused_hc("hc_expand_sinkhorn", hc, n_tokens, d));
  if (sinkhorn_iters < 1) return make_error("hc_expand_sinkhorn: ", sinkhorn_iters, " iterations (need ≥ 1)");
  if (n_tokens <= 0) return {};
  const dim3 grid(unsigned((d + kExpandThreads - 1) / kExpandThreads), unsigned(n_tokens));
  if (hc == 4)
    launch(hc_expand_sinkhorn_kernel<4>, grid, kExpandThreads, 0, stream, x_streams, y, from, sinkhorn_iters, d,
           round_out, pre_out);
  else
    launch(hc_expand_sinkhorn_kernel<2>, grid, kExpandThreads, 0, stream, x_streams, y, from, sinkhorn_iters, d,
           round_out, pre_out);
  return launch_status("hc_expand_sinkhorn_kernel");
}

}  // namespace spw::cuda
