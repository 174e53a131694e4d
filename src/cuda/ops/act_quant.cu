// Activation fake quant and the compact fp8/fp4 codes (contract in act_quant.h).
// One warp per (row, quant block): it finds the block's amax, derives the scale exactly as
// formats/quant.cpp does, then quantizes its elements (writing f32 values, or codes and the scale).
// Unpacking is one thread per element.
#include "cuda/ops/act_quant.h"
#include "cuda/ops/device_numerics.cuh"
#include "cuda/launch.h"

namespace spw::cuda {
namespace {

constexpr int kThreads = 128;

// formats/quant.cpp: 1/448 and 1/6 evaluated in double, stored as f32.
constexpr float kInvE4m3Max = static_cast<float>(1.0 / 448.0);
constexpr float kInvE2m1Max = static_cast<float>(1.0 / 6.0);

enum class Kind { kFp8, kFp4Ue8m0, kFp4E4m3 };

// Out-of-place pack (q, scale set) or in-place fake quant (q == nullptr: values written back to x).
// One warp per (row, quant block): lane l takes elements l, l + 32, ... (fp8) or the pairs (2p, 2p + 1),
// p = l, l + 32, ... (fp4, whose pairs share a byte); the block's amax is the warp's max of the lanes'
// maxima (max is exact in any order, and NaN is skipped as in the one-thread loop: every partial starts at 0),
// then every element gets the same operations as formats/quant.cpp's loop. The first version gave each block
// to one thread: 35 µs for a decode token's 6 × 2048 expert activations (V4, a kernel trace).
template <Kind K>
__global__ void __launch_bounds__(kThreads)
    quant_blocks_kernel(float* x, int64_t x_stride, int64_t n_rows, int64_t n, int block, uint8_t* q,
                        int64_t q_stride, uint8_t* scale, int64_t scale_stride) {
  pdl_enter();
  const int64_t n_blocks = n / block;
  const int64_t job = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (job >= n_rows * n_blocks) return;  // the whole warp
  const int64_t r = job / n_blocks, b = job % n_blocks;
  float* xb = x + r * x_stride + b * block;
  float amax = 0.0f;
  for (int i = lane; i < block; i += 32) amax = dev::max_std(amax, fabsf(xb[i]));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = dev::max_std(amax, __shfl_xor_sync(0xffffffffu, amax, off));

  float s = 0.0f, lim = 0.0f;
  uint8_t scale_code = 0;
  if constexpr (K == Kind::kFp8) {
    const int e = dev::pow2_ceil_exp(dev::max_std(amax, 1e-4f) * kInvE4m3Max);
    s = ldexpf(1.0f, e), lim = 448.0f, scale_code = static_cast<uint8_t>(e + 127);
  } else if constexpr (K == Kind::kFp4Ue8m0) {
    const int e = dev::pow2_ceil_exp(dev::max_std(amax, 6.0f * ldexpf(1.0f, -126)) * kInvE2m1Max);
    s = ldexpf(1.0f, e), lim = 6.0f, scale_code = static_cast<uint8_t>(e + 127);
  } else {
    scale_code = dev::f32_to_e4m3(dev::max_std(amax, 6.0f * ldexpf(1.0f, -9)) / 6.0f);
    s = dev::e4m3_to_f32(scale_code), lim = 6.0f;
  }

  if (q == nullptr) {
    for (int i = lane; i < block; i += 32) {
      const float v = dev::clamp_std(xb[i] / s, -lim, lim);
      xb[i] = (K == Kind::kFp8 ? dev::e4m3_to_f32(dev::f32_to_e4m3(v)) : dev::e2m1_to_f32(dev::f32_to_e2m1(v))) * s;
    }
    return;
  }
  if (lane == 0) scale[r * scale_stride + b] = scale_code;
  if constexpr (K == Kind::kFp8) {
    uint8_t* qb = q + r * q_stride + b * block;
    for (int i = lane; i < block; i += 32) qb[i] = dev::f32_to_e4m3(dev::clamp_std(xb[i] / s, -lim, lim));
  } else {
    uint8_t* qb = q + r * q_stride + b * block / 2;
    for (int p = lane; p < block / 2; p += 32) {
      const uint8_t lo = dev::f32_to_e2m1(dev::clamp_std(xb[2 * p] / s, -lim, lim));
      const uint8_t hi = dev::f32_to_e2m1(dev::clamp_std(xb[2 * p + 1] / s, -lim, lim));
      qb[p] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// y = code value · scale value, one thread per element.
template <Kind K>
__global__ void unpack_kernel(const uint8_t* q, int64_t q_stride, const uint8_t* scale, int64_t scale_stride,
                              int64_t n_rows, int64_t n, int block, float* y, int64_t y_stride) {
  pdl_enter();
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_rows * n) return;
  const int64_t r = job / n, i = job % n;
  const uint8_t sc = scale[r * scale_stride + i / block];
  float v = 0.0f;
  if constexpr (K == Kind::kFp8) {
    v = dev::e4m3_to_f32(q[r * q_stride + i]);
  } else {
    const uint8_t byte = q[r * q_stride + i / 2];
    v = dev::e2m1_to_f32((i % 2 == 0) ? (byte & 0x0f) : (byte >> 4));
  }
  y[r * y_stride + i] = v * (K == Kind::kFp4E4m3 ? dev::e4m3_to_f32(sc) : dev::e8m0_to_f32(sc));
}

Status check_shape(const char* op, int64_t n_rows, int64_t n, int block, bool fp4) {
  if (block <= 0 || n <= 0 || n % block != 0 || (fp4 && block % 2 != 0))
    return make_error(op, ": row width ", n, " is not a positive multiple of block ", block, fp4 ? " (even)" : "");
  if (n_rows < 0) return make_error(op, ": negative row count ", n_rows);
  return {};
}

template <Kind K>
Status launch_quant(const char* op, float* x, int64_t x_stride, int64_t n_rows, int64_t n, int block, uint8_t* q,
                    int64_t q_stride, uint8_t* scale, int64_t scale_stride, cudaStream_t stream) {
  SPW_TRY(check_shape(op, n_rows, n, block, K != Kind::kFp8));
  const int64_t jobs = n_rows * (n / block);
  if (jobs == 0) return {};
  launch(quant_blocks_kernel<K>, grid_for(jobs * 32, kThreads), kThreads, 0, stream, x, x_stride, n_rows, n, block, q,
                                                                                  q_stride, scale, scale_stride);
  return launch_status(op);
}

template <Kind K>
Status launch_unpack(const char* op, const uint8_t* q, int64_t q_stride, const uint8_t* scale, int64_t scale_stride,
                     int64_t n_rows, int64_t n, int block, float* y, int64_t y_stride, cudaStream_t stream) {
  SPW_TRY(check_shape(op, n_rows, n, block, K != Kind::kFp8));
  if (n_rows == 0) return {};
  launch(unpack_kernel<K>, grid_for(n_rows * n, kThreads), kThreads, 0, stream, q, q_stride, scale, scale_stride, n_rows,
                                                                             n, block, y, y_stride);
  return launch_status(op);
}

}  // namespace

Status fake_quant_fp8(float* x, int64_t n_rows, int64_t n, int64_t row_stride, int block, cudaStream_t stream) {
  return launch_quant<Kind::kFp8>("fake_quant_fp8", x, row_stride, n_rows, n, block, nullptr, 0, nullptr, 0, stream);
}

Status fake_quant_fp4_ue8m0(float* x, int64_t n_rows, int64_t n, int64_t row_stride, int block, cudaStream_t stream) {
  return launch_quant<Kind::kFp4Ue8m0>("fake_quant_fp4_ue8m0", x, row_stride, n_rows, n, block, nullptr, 0, nullptr, 0,
                                       stream);
}

Status fake_quant_fp4_e4m3(float* x, int64_t n_rows, int64_t n, int64_t row_stride, int block, cudaStream_t stream) {
  return launch_quant<Kind::kFp4E4m3>("fake_quant_fp4_e4m3", x, row_stride, n_rows, n, block, nullptr, 0, nullptr, 0,
                                      stream);
}

// pack reads x only: the kernel's x is non-const because the same kernel fakes quant in place.
Status pack_fp8(const float* x, int64_t x_stride, int64_t n_rows, int64_t n, int block, uint8_t* q, int64_t q_stride,
                uint8_t* scale, int64_t scale_stride, cudaStream_t stream) {
  return launch_quant<Kind::kFp8>("pack_fp8", const_cast<float*>(x), x_stride, n_rows, n, block, q, q_stride, scale,
                                  scale_stride, stream);
}

Status unpack_fp8(const uint8_t* q, int64_t q_stride, const uint8_t* scale, int64_t scale_stride, int64_t n_rows,
                  int64_t n, int block, float* y, int64_t y_stride, cudaStream_t stream) {
  return launch_unpack<Kind::kFp8>("unpack_fp8", q, q_stride, scale, scale_stride, n_rows, n, block, y, y_stride,
                                   stream);
}

Status pack_fp4(Fp4Scale kind, const float* x, int64_t x_stride, int64_t n_rows, int64_t n, int block, uint8_t* q,
                int64_t q_stride, uint8_t* scale, int64_t scale_stride, cudaStream_t stream) {
  float* xm = const_cast<float*>(x);
  if (kind == Fp4Scale::kUe8m0)
    return launch_quant<Kind::kFp4Ue8m0>("pack_fp4_ue8m0", xm, x_stride, n_rows, n, block, q, q_stride, scale,
                                         scale_stride, stream);
  return launch_quant<Kind::kFp4E4m3>("pack_fp4_e4m3", xm, x_stride, n_rows, n, block, q, q_stride, scale,
                                      scale_stride, stream);
}

Status unpack_fp4(Fp4Scale kind, const uint8_t* q, int64_t q_stride, const uint8_t* scale, int64_t scale_stride,
                  int64_t n_rows, int64_t n, int block, float* y, int64_t y_stride, cudaStream_t stream) {
  if (kind == Fp4Scale::kUe8m0)
    return launch_unpack<Kind::kFp4Ue8m0>("unpack_fp4_ue8m0", q, q_stride, scale, scale_stride, n_rows, n, block, y,
                                          y_stride, stream);
  return launch_unpack<Kind::kFp4E4m3>("unpack_fp4_e4m3", q, q_stride, scale, scale_stride, n_rows, n, block, y,
                                       y_stride, stream);
}

}  // namespace spw::cuda
