// round_bf16, rms_norm and rms_norm_rope (contract in norm.h). One thread per element for rounding; one block per
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

// RoPE on the last 2·half channels of row r after the norm (half = 0: none), at positions[r / rows_per_pos].
struct NormRope {
  int half = 0;
  const float* freqs = nullptr;
  const int64_t* positions = nullptr;
  int64_t rows_per_pos = 1;
};

__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* x, const float* w, float* y, int64_t d, float eps, bool round_out, NormRope rope) {
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
  auto normed = [&](int64_t i) {
    const float v = (w ? w[i] : 1.0f) * (xr[i] * inv);
    return round_out ? dev::round_bf16(v) : v;
  };
  const int64_t d_nope = d - 2 * rope.half;
  for (int64_t i = threadIdx.x; i < d_nope; i += blockDim.x) yr[i] = normed(i);
  if (rope.half == 0) return;
  // rope_apply_rounded's rotation of the normalized (and rounded) pair, then its rounding: each pair is read
  // by the thread that writes it, so y == x stays safe.
  const float pos = float(rope.positions[blockIdx.x / rope.rows_per_pos]);
  for (int i = threadIdx.x; i < rope.half; i += blockDim.x) {
    const float a = normed(d_nope + 2 * i), b = normed(d_nope + 2 * i + 1);
    const float angle = pos * rope.freqs[i];
    const float c = dev::cos_f32(angle), s = dev::sin_f32(angle);
    float u = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), v = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    if (round_out) u = dev::round_bf16(u), v = dev::round_bf16(v);
    yr[d_nope + 2 * i] = u, yr[d_nope + 2 * i + 1] = v;
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
  launch(rms_norm_kernel, unsigned(n_rows), kNormThreads, 0, stream, x, w, y, d, eps, round_out, NormRope{});
  return launch_status("rms_norm_kernel");
}

Status rms_norm_rope(const float* x, const float* w, float* y, int64_t n_rows, int64_t d, float eps, bool round_out,
                     int d_rope, const float* freqs, const int64_t* positions, int64_t rows_per_pos,
                     cudaStream_t stream) {
  if (d <= 0) return make_error("rms_norm: row width ", d, " must be positive");
  if (d_rope <= 0 || d_rope % 2 != 0 || d_rope > d)
    return make_error("rms_norm_rope: d_rope ", d_rope, " must be even and within the row width ", d);
  if (rows_per_pos <= 0 || n_rows % rows_per_pos != 0)
    return make_error("rms_norm_rope: ", n_rows, " rows are not a multiple of ", rows_per_pos, " per position");
  if (n_rows <= 0) return {};
  if (n_rows > INT32_MAX) return make_error("rms_norm: ", n_rows, " rows exceed one grid dimension");
  launch(rms_norm_kernel, unsigned(n_rows), kNormThreads, 0, stream, x, w, y, d, eps, round_out,
         NormRope{d_rope / 2, freqs, positions, rows_per_pos});
  return launch_status("rms_norm_kernel");
}

}  // namespace spw::cuda
