// Tensor-core pieces shared by the GEMV kernels of many tokens (dense_gemv_mma.cu, dense_gemv_mma_wide.cu): exact
// e4m3 → f16 pairs, the m16n8k16 MMAs with f32 accumulation, and the store of a row group's accumulators.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/dense/dense_device.cuh"

namespace spw::densedev {

// Two e4m3 codes (low byte first) as an f16x2 register (low half first): exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Stores a warp's accumulators of row group row0 (the MMA's C layout: lane (g, t4) holds rows row0 + g and row0 + g + 8
// of tokens 8·nt + 2·t4 and + 1) through store_output, skipping rows past n_out and tokens past n_tokens.
template <int NT>
__device__ __forceinline__ void store_row_group(const GemvArgs& a, float* y, const float (&v)[NT][4], int row0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3, r_lo = row0 + g, r_hi = r_lo + 8;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n0 = 8 * nt + 2 * t4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = j < 2 ? r_lo : r_hi, n = n0 + (j & 1);
      if (row < a.n_out && n < a.n_tokens) store_output(a, y, row, n, v[nt][j]);
    }
  }
}

}  // namespace spw::densedev
