// Elementwise helpers of the dense linears (dense_kernels.h): the activation fake quant (bit-exact
// with formats/quant.h fake_quant_fp8), the weight dequantization into GEMM scratch (exact), and the
// bf16 rounding of outputs. Simple one-thread-per-item kernels: they move a small fraction of the
// bytes of the products they feed.
// Tests: tests/gpu/test_cuda_dense.cpp (through linear_cuda, and the quantized activation directly).
#include <cuda_bf16.h>

#include "cuda/dense/dense_device.cuh"
#include "cuda/dense/dense_kernels.h"
#include "cuda/launch.h"

namespace spw::densedev {
namespace {

constexpr int kThreads = 256;

// One warp per (token, block of act_block).
template <bool Bf16Out>
__global__ void __launch_bounds__(kThreads) act_quant_kernel(const float* __restrict__ x, int n_tokens, int n_in,
                                                             int act_block, void* out) {
  cuda::pdl_enter();
  const int lane = threadIdx.x & 31;
  const long job = static_cast<long>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  const int blocks_per_row = n_in / act_block;
  if (job >= static_cast<long>(n_tokens) * blocks_per_row) return;
  const size_t base = static_cast<size_t>(job) * act_block;  // rows are contiguous: block j of row t starts at (t·bpr + j)·B
  const float s = warp_block_scale(x, base, act_block, lane);
  for (int i = lane; i < act_block; i += 32) {
    const float v = fake_quant_fp8_elem(x[base + i], s);
    if constexpr (Bf16Out) static_cast<__nv_bfloat16*>(out)[base + i] = __float2bfloat16_rn(v);
    else static_cast<float*>(out)[base + i] = v;
  }
}

// act_quant_kernel's arithmetic, storing the codes (as f16 bits) and the block scales instead of their product.
__global__ void __launch_bounds__(kThreads) act_codes_kernel(const float* __restrict__ x, int n_tokens, int n_in,
                                                             int act_block, uint16_t* codes, float* scales) {
  cuda::pdl_enter();
  const int lane = threadIdx.x & 31;
  const long job = static_cast<long>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (job >= static_cast<long>(n_tokens) * (n_in / act_block)) return;
  const size_t base = static_cast<size_t>(job) * act_block;
  const float s = warp_block_scale(x, base, act_block, lane);
  for (int i = lane; i < act_block; i += 32) codes[base + i] = fake_quant_fp8_code(x[base + i], s);
  if (lane == 0) scales[job] = s;
}

template <bool Bf16Out>
__global__ void __launch_bounds__(kThreads) act_copy_kernel(const float* __restrict__ x, size_t n, void* out) {
  cuda::pdl_enter();
  const size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  if constexpr (Bf16Out) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(x[i]);
  else static_cast<float*>(out)[i] = x[i];
}

// One thread per 16-element chunk of the rows [row0, row0 + n_rows).
template <DenseFormat F, bool Bf16Out>
__global__ void __launch_bounds__(kThreads) dequant_rows_kernel(DeviceLinear w, int row0, int n_rows, void* out) {
  cuda::pdl_enter();
  const int chunks = w.n_in / 16;
  const size_t job = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (job >= static_cast<size_t>(n_rows) * chunks) return;
  const int r = static_cast<int>(job / chunks), k = static_cast<int>(job % chunks) * 16;
  float v[16];
  dequant_chunk<F>(load_chunk<F>(w.w, w.scale, row0 + r, k, w.n_in, w.weight_block), v);
  const size_t o = static_cast<size_t>(r) * w.n_in + k;
  if constexpr (Bf16Out) {
    __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + o);
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
  } else {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(out) + o);
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
  }
}

__global__ void __launch_bounds__(kThreads) round_bf16_kernel(float* y, size_t n) {
  cuda::pdl_enter();
  const size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) y[i] = round_bf16_dev(y[i]);
}

// x = hi + mid + lo exactly, each a bf16 (x3 [3][n]): hi = bf16(x), and each residual is exact in f32 (it has at
// most 16, then 8, significant bits), so three bf16 planes carry all 24 bits of x's significand (normal range;
// below ~2^-110 the lowest plane can lose bits to bf16's subnormals).
__global__ void __launch_bounds__(kThreads) split3_bf16_kernel(const float* __restrict__ x, size_t n,
                                                               __nv_bfloat16* __restrict__ x3) {
  cuda::pdl_enter();
  const size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const __nv_bfloat16 hi = __float2bfloat16_rn(v);
  const float r1 = v - __bfloat162float(hi);
  const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
  x3[i] = hi;
  x3[n + i] = mid;
  x3[2 * n + i] = __float2bfloat16_rn(r1 - __bfloat162float(mid));
}

// y[t, row0 + o] = (y3[t][o] + y3[n + t][o]) + y3[2n + t][o] for the n_rows-wide chunk y3 [3·n_tokens][n_rows].
__global__ void __launch_bounds__(kThreads) sum3_rows_kernel(const float* __restrict__ y3, int n_tokens, int n_rows,
                                                             float* __restrict__ y, int ldy, int row0) {
  cuda::pdl_enter();
  const size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  const size_t plane = static_cast<size_t>(n_tokens) * n_rows;
  if (i >= plane) return;
  const int t = static_cast<int>(i / n_rows), o = static_cast<int>(i % n_rows);
  y[static_cast<size_t>(t) * ldy + row0 + o] = (y3[i] + y3[plane + i]) + y3[2 * plane + i];
}

unsigned blocks_for(size_t items) { return static_cast<unsigned>((items + kThreads - 1) / kThreads); }

template <bool Bf16Out>
cudaError_t dequant_rows_as(const DeviceLinear& w, int row0, int n_rows, void* out, cudaStream_t stream) {
  const unsigned grid = blocks_for(static_cast<size_t>(n_rows) * (w.n_in / 16));
  switch (w.format) {
    case DenseFormat::kFp8: cuda::launch(dequant_rows_kernel<DenseFormat::kFp8, Bf16Out>, grid, kThreads, 0, stream, w, row0, n_rows, out); break;
    case DenseFormat::kFp4: cuda::launch(dequant_rows_kernel<DenseFormat::kFp4, Bf16Out>, grid, kThreads, 0, stream, w, row0, n_rows, out); break;
    case DenseFormat::kBf16: cuda::launch(dequant_rows_kernel<DenseFormat::kBf16, Bf16Out>, grid, kThreads, 0, stream, w, row0, n_rows, out); break;
    case DenseFormat::kF32: cuda::launch(dequant_rows_kernel<DenseFormat::kF32, Bf16Out>, grid, kThreads, 0, stream, w, row0, n_rows, out); break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t act_prepare_launch(const float* x, int n_tokens, int n_in, int act_block, void* out, bool out_bf16,
                               cudaStream_t stream) {
  const size_t n = static_cast<size_t>(n_tokens) * n_in;
  if (act_block > 0) {
    const unsigned grid = static_cast<unsigned>((n / act_block + kThreads / 32 - 1) / (kThreads / 32));
    if (out_bf16) cuda::launch(act_quant_kernel<true>, grid, kThreads, 0, stream, x, n_tokens, n_in, act_block, out);
    else cuda::launch(act_quant_kernel<false>, grid, kThreads, 0, stream, x, n_tokens, n_in, act_block, out);
  } else {
    if (out_bf16) cuda::launch(act_copy_kernel<true>, blocks_for(n), kThreads, 0, stream, x, n, out);
    else cuda::launch(act_copy_kernel<false>, blocks_for(n), kThreads, 0, stream, x, n, out);
  }
  return cudaGetLastError();
}

cudaError_t act_codes_launch(const float* x, int n_tokens, int n_in, int act_block, uint16_t* codes, float* scales,
                             cudaStream_t stream) {
  const size_t jobs = static_cast<size_t>(n_tokens) * (n_in / act_block);
  const unsigned grid = static_cast<unsigned>((jobs + kThreads / 32 - 1) / (kThreads / 32));
  cuda::launch(act_codes_kernel, grid, kThreads, 0, stream, x, n_tokens, n_in, act_block, codes, scales);
  return cudaGetLastError();
}

cudaError_t dequant_rows_launch(const DeviceLinear& w, int row0, int n_rows, void* out, bool out_bf16,
                                cudaStream_t stream) {
  return out_bf16 ? dequant_rows_as<true>(w, row0, n_rows, out, stream) : dequant_rows_as<false>(w, row0, n_rows, out, stream);
}

cudaError_t split3_bf16_launch(const float* x, size_t n, void* x3, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  cuda::launch(split3_bf16_kernel, blocks_for(n), kThreads, 0, stream, x, n, static_cast<__nv_bfloat16*>(x3));
  return cudaGetLastError();
}

cudaError_t sum3_rows_launch(const float* y3, int n_tokens, int n_rows, float* y, int ldy, int row0,
                             cudaStream_t stream) {
  const size_t n = static_cast<size_t>(n_tokens) * n_rows;
  if (n == 0) return cudaSuccess;
  cuda::launch(sum3_rows_kernel, blocks_for(n), kThreads, 0, stream, y3, n_tokens, n_rows, y, ldy, row0);
  return cudaGetLastError();
}

cudaError_t round_bf16_launch(float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  cuda::launch(round_bf16_kernel, blocks_for(n), kThreads, 0, stream, y, n);
  return cudaGetLastError();
}

}  // namespace spw::densedev
