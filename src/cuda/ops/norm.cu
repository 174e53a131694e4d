// round_bf16 and rms_norm (contract in norm.h). One thread per element for rounding; one block per
// row for the norm: the block sums squares in f64, then every thread scales its strided elements.
#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/norm.h"
#include "cuda/launch.h"

namespace spw::cuda {
namespace {

constexpr int kThreads = 256;
// rms_norm rows are 5120–20480 wide and decode has a handful of them: a wide block keeps more loads in flight
// (256 threads took 8 µs per decode call on the H200, a chain of 20 dependent round trips).
constexpr int kNormThreads = 1024;

__global__ void round_bf16_kernel(float* x, int64_t n) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = dev::round_bf16(x[i]);
}

__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* x, const float* w, float* y, int64_t d, float eps, bool round_out) {
  if (w && blockIdx.x == 0) prefetch_l2(w, size_t(d) * sizeof(float));  // the weight, while x is still being written
  pdl_enter();
  __shared__ double scratch[32];
  const float* xr = x + int64_t(blockIdx.x) * d;
  float* yr = y + int64_t(blockIdx.x) * d;
  double ss = 0.0;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += double(xr[i]) * xr[i];
  ss = dev::block_sum(ss, scratch);
  // The reference: 1.0f / std::sqrt(float(ss / double(d)) + eps); IEEE sqrt and division here.
  const float inv = 1.0f / sqrtf(float(ss / double(d)) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float v = (w ? w[i] : 1.0f) * (xr[i] * inv);
    yr[i] = round_out ? dev::round_bf16(v) : v;
  }
}

}  // namespace

Status round_bf16(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return {};
  launch(round_bf16_kernel, grid_for(n, kThreads), kThreads, 0, stream, x, n);
  return launch_status("round_bf16_kernel");
}

Status rms_norm(const float* x, const float* w, float* y, int64_t n_rows, int64_t d, float eps, bool round_out,
                cudaStream_t stream) {
  if (d <= 0) return make_error("rms_norm: row width ", d, " must be positive");
  if (n_rows <= 0) return {};
  if (n_rows > INT32_MAX) return make_error("rms_norm: ", n_rows, " rows exceed one grid dimension");
  launch(rms_norm_kernel, unsigned(n_rows), kNormThreads, 0, stream, x, w, y, d, eps, round_out);
  return launch_status("rms_norm_kernel");
}

}  // namespace spw::cuda
