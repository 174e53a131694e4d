// Device twins of the scalar number-format routines in formats/dtypes.cpp and of the f32 math the
// CPU references use, written so that the GPU ops reproduce the references bit for bit.
//
// Hazards this header exists for:
// - nvcc contracts a·b + c into one FMA by default; the CPU references are built for baseline x86-64
//   (no FMA), so every product that feeds a sum here goes through __fmul_rn / __fadd_rn, which are
//   never contracted.
// - glibc's expf / log1pf / sinf / cosf are (nearly always) correctly rounded; CUDA's f32 versions
//   are up to 2 ulp off. The *_f32 helpers below evaluate in double and round once, which is the
//   correctly rounded f32 result except when the true value lies within ~2^-29 ulp of a rounding
//   midpoint. Tests state this as their tolerance where it applies.
// - frexpf / ldexpf / rintf are exact on the device and rintf rounds to nearest even, so the
//   minifloat encoder is the CPU algorithm verbatim.
// Internal to src/cuda/ops (not installed for other families).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::cuda::dev {

// ---- bf16, e4m3, ue8m0, e2m1 (formats/dtypes.h) ----

__device__ inline float round_bf16(float v) {
  uint32_t bits = __float_as_uint(v);
  if (isnan(v)) return __uint_as_float(((bits >> 16) | 0x0040u) << 16);
  uint32_t lsb = (bits >> 16) & 1u;
  return __uint_as_float(((bits + 0x7fffu + lsb) >> 16) << 16);
}

// formats/dtypes.cpp round_minifloat: magnitude code of a = |v| (finite, ≥ 0), no saturation.
__device__ inline uint32_t round_minifloat(float a, int mant_bits, int min_exp) {
  int exp = 0;
  frexpf(a, &exp);
  int e = exp - 1;
  if (a == 0.0f || e < min_exp) e = min_exp;
  float units = rintf(ldexpf(a, mant_bits - e));
  uint32_t q = static_cast<uint32_t>(units);
  if (a < ldexpf(1.0f, min_exp)) return q;
  uint32_t biased = static_cast<uint32_t>(e - min_exp + 1);
  return (biased << mant_bits) + (q - (1u << mant_bits));
}

__device__ inline float e4m3_to_f32(uint8_t code) {
  float sign = (code & 0x80) ? -1.0f : 1.0f;
  int exp = (code >> 3) & 0xf;
  int mant = code & 0x7;
  if (exp == 0xf && mant == 0x7) return __int_as_float(0x7fc00000);
  if (exp == 0) return sign * ldexpf(static_cast<float>(mant), -9);
  return sign * ldexpf(static_cast<float>(mant | 0x8), exp - 10);
}

__device__ inline uint8_t f32_to_e4m3(float value) {
  if (isnan(value)) return 0x7f;
  uint8_t sign = signbit(value) ? 0x80 : 0x00;
  float a = fabsf(value);
  if (a > 448.0f) return sign | 0x7e;
  return sign | static_cast<uint8_t>(round_minifloat(a, 3, -6));
}

__device__ inline float e8m0_to_f32(uint8_t code) {
  if (code == 0xff) return __int_as_float(0x7fc00000);
  return ldexpf(1.0f, static_cast<int>(code) - 127);
}

__device__ inline float e2m1_to_f32(uint8_t nibble) {
  const int i = nibble & 0x7;
  // {0, 0.5, 1, 1.5, 2, 3, 4, 6}
  const float m = i < 4 ? 0.5f * i : (i == 4 ? 2.0f : (i == 5 ? 3.0f : (i == 6 ? 4.0f : 6.0f)));
  return (nibble & 0x8) ? -m : m;
}

__device__ inline uint8_t f32_to_e2m1(float value) {
  if (isnan(value)) return 0x7;
  uint8_t sign = signbit(value) ? 0x8 : 0x0;
  float a = fabsf(value);
  if (a >= 6.0f) return sign | 0x7;
  return sign | static_cast<uint8_t>(round_minifloat(a, 1, 0));
}

// pow2_ceil(v) = 2^pow2_ceil_exp(v): exponent of v's bit pattern, plus one if the mantissa is non-zero.
__device__ inline int pow2_ceil_exp(float v) {
  uint32_t bits = __float_as_uint(v);
  int exp = static_cast<int>((bits >> 23) & 0xff) - 127;
  if (bits & 0x7fffffu) exp += 1;
  return exp;
}

// std::clamp / std::max / std::min spelled as the standard library evaluates them (NaN behaviour too).
__device__ inline float clamp_std(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }
__device__ inline float max_std(float a, float b) { return a < b ? b : a; }
__device__ inline float min_std(float a, float b) { return b < a ? b : a; }

// ---- f32 transcendentals as glibc rounds them (see the header comment) ----

__device__ inline float exp_f32(float x) { return static_cast<float>(exp(static_cast<double>(x))); }
__device__ inline float log1p_f32(float x) { return static_cast<float>(log1p(static_cast<double>(x))); }
__device__ inline float sin_f32(float x) { return static_cast<float>(sin(static_cast<double>(x))); }
__device__ inline float cos_f32(float x) { return static_cast<float>(cos(static_cast<double>(x))); }

// ops/ref/linalg.cpp
__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + exp_f32(-x)); }
__device__ inline float silu(float x) { return x / (1.0f + exp_f32(-x)); }
__device__ inline float softplus(float x) { return x > 20.f ? x : log1p_f32(exp_f32(x)); }

// ---- block reductions (blockDim.x a multiple of 32, ≤ 1024; every thread must call) ----

__device__ inline double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block; the result is returned to every thread. scratch: ≥ 32 doubles of shared memory.
__device__ inline double block_sum(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double t = lane < n_warps ? scratch[lane] : 0.0;
  return warp_sum(t);
}

// The better of two (value, index) candidates: larger value, ties to the lower index (ref::topk_indices).
__device__ inline bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// Block argmax with ties to the lower index; every thread gets the winner. scratch_v / scratch_i: ≥ 32.
__device__ inline void block_argmax(float& v, int& i, float* scratch_v, int* scratch_i) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  __syncthreads();
  if (lane == 0) scratch_v[warp] = v, scratch_i[warp] = i;
  __syncthreads();
  v = lane < n_warps ? scratch_v[lane] : -INFINITY;
  i = lane < n_warps ? scratch_i[lane] : INT32_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
}

}  // namespace spw::cuda::dev

namespace spw::cuda {

// The launch status of the kernel just issued (configuration errors surface here; faults later).
inline Status launch_status(const char* kernel) {
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return make_error("CUDA launch ", kernel, ": ", cudaGetErrorString(e));
  return {};
}

inline unsigned grid_for(int64_t n_threads, int block) { return static_cast<unsigned>((n_threads + block - 1) / block); }

}  // namespace spw::cuda
