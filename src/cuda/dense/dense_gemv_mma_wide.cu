// Tensor-core GEMV of 17 to kGemvMmaMaxTokens tokens on weights of many rows (dense_linear.h, LinearPath::kGemv;
// dense_gemv_mma.cu's gemv_mma_launch chooses): the FP8 and BF16 forms of dense_gemv_mma.cu (its contract, layout,
// k order and accuracy), laid out for many tokens.
//
// Why: with one warp per (row group, k split), every warp reads its own slice of x from L2, and at 64 tokens that is
// 64 bytes of x per 16 weight bytes; the warps waited on those loads (bench_dense on an H100: the head at 64 tokens
// 18.7 % of the copy rate, FP8 wo_b 8.1 %). Here a block's eight warps own eight row groups (128 rows) and walk all
// of k together, so x is copied into shared memory once per block (cp.async, a stage ahead of its use) and every warp
// reads its MMA columns from there; weights stream into registers a stage ahead as before.
//
// Same bits as dense_gemv_mma.cu: there the k blocks of a row group are cut into `splits` ranges (a function of n_in
// alone), one warp each, whose sums meet in split order (total = sum₀, then total += sum_s). Here the one warp of the
// row group walks the ranges in order, each into a fresh accumulator that joins the running total at the range's
// end — the same fmas, MMAs and adds in the same order. Tests: tests/gpu/test_cuda_dense.cpp (token counts 17..70
// against 1, 2 and 17 at a time). Benchmark: bench/dense/bench_dense.cpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/dense/dense_device.cuh"
#include "cuda/dense/dense_kernels.h"
#include "cuda/dense/dense_mma.cuh"
#include "cuda/launch.h"

namespace spw::densedev {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kFp8StageBlocks = 4;   // k blocks (of 32) per stage: 32 weight bytes per lane, as dense_gemv_mma.cu
constexpr int kBf16StageBlocks = 2;  // 64 weight bytes per lane

__device__ __forceinline__ unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
// 16 (or 4) bytes from global to shared memory, asynchronously; zeros where !valid (src-size 0: nothing is read).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most one group (the stage issued last) is in flight.
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// A row group's sums over its k split ranges (see the top): acc holds range `split`; advance_to(s) closes every range
// before s, empty ones as zeros, into total (the first range's sum, then += each later one).
template <int NT>
struct SplitSums {
  float total[NT][4] = {}, acc[NT][4] = {};
  int split = 0;
  __device__ __forceinline__ void advance_to(int s) {
    for (; split < s; ++split) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          total[nt][j] = split == 0 ? acc[nt][j] : total[nt][j] + acc[nt][j];
          acc[nt][j] = 0.f;
        }
    }
  }
};

// The stage walk of both kernels, which call it with stage 0's weights loaded into w0 and after cuda::pdl_enter()
// (weights may load while the previous kernel still writes x; x may not). A stage's weights are loaded into registers
// (W: the kernel's stage of rows r_lo and r_hi) while the previous stage computes; its x is copied into shared buffer
// stage % 2 a stage ahead (cp.async, one group per stage). load_w(W&, stage), issue_x(stage, buffer),
// compute(const W&, stage, buffer).
template <class W, class LoadW, class IssueX, class Compute>
__device__ __forceinline__ void walk_stages(int n_stages, W& w0, LoadW&& load_w, IssueX&& issue_x, Compute&& compute) {
  W w1;
  issue_x(0, 0);
  cp_async_commit();
  for (int st = 0; st < n_stages;) {
    if (st + 1 < n_stages) issue_x(st + 1, 1);
    cp_async_commit();  // one group per stage, empty past the end
    load_w(w1, st + 1);
    cp_async_wait_one();
    __syncthreads();
    compute(w0, st, 0);
    __syncthreads();  // buffer 0 is read; the next issue may overwrite it
    if (++st >= n_stages) break;
    if (st + 1 < n_stages) issue_x(st + 1, 0);
    cp_async_commit();
    load_w(w0, st + 1);
    cp_async_wait_one();
    __syncthreads();
    compute(w1, st, 1);
    __syncthreads();
    ++st;
  }
}

// FP8 weights, x̂ as f16 codes and f32 scales (GemvArgs). Shared memory: codes [2][SB][T][32] f16, then scales
// [2][SB][T] f32 (T = 8·NT tokens, zero past n_tokens).
template <int NT>
__global__ void __launch_bounds__(kThreads, 1) gemv_mma_wide_kernel(GemvArgs a, int splits) {
  constexpr int SB = kFp8StageBlocks, T = 8 * NT;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* xc_s = reinterpret_cast<uint16_t*>(smem);
  float* xs_s = reinterpret_cast<float*>(smem + sizeof(uint16_t) * 2 * SB * T * 32);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int row0 = (blockIdx.x * kWarps + warp) * 16, r_lo = row0 + g, r_hi = r_lo + 8;
  const bool lo_ok = r_lo < a.n_out, hi_ok = r_hi < a.n_out;
  const int n_kb = a.n_in / 32, per = (n_kb + splits - 1) / splits, n_stages = (n_kb + SB - 1) / SB;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const uint8_t* w_lo = w + static_cast<size_t>(lo_ok ? r_lo : 0) * a.n_in + 8 * t4;
  const uint8_t* w_hi = w + static_cast<size_t>(hi_ok ? r_hi : 0) * a.n_in + 8 * t4;
  const int wb_shift = __ffs(a.weight_block) - 1, ab_shift = __ffs(a.act_block) - 1;
  const int scale_cols = (a.n_in + a.weight_block - 1) >> wb_shift, xs_cols = a.n_in >> ab_shift;
  const uint8_t* sw_row = a.scale + static_cast<size_t>(row0 < a.n_out ? row0 >> wb_shift : 0) * scale_cols;

  auto issue_x = [&](int stage, int buf) {
    for (int c = threadIdx.x; c < SB * T * 4; c += kThreads) {
      const int i = c / (T * 4), n = (c >> 2) % T, q = c & 3, kb = stage * SB + i;
      const bool ok = n < a.n_tokens && kb < n_kb;
      cp_async16(smem_u32(xc_s + ((buf * SB + i) * T + n) * 32 + 8 * q),
                 ok ? a.xc + static_cast<size_t>(n) * a.n_in + 32 * kb + 8 * q : a.xc, ok);
    }
    for (int c = threadIdx.x; c < SB * T; c += kThreads) {
      const int i = c / T, n = c % T, kb = stage * SB + i;
      const bool ok = n < a.n_tokens && kb < n_kb;
      cp_async4(smem_u32(xs_s + (buf * SB + i) * T + n),
                ok ? a.xs + static_cast<size_t>(n) * xs_cols + ((32 * kb) >> ab_shift) : a.xs, ok);
    }
  };
  struct WStage {
    uint2 lo[SB], hi[SB];  // rows r_lo and r_hi, 8 weights each per k block
  };
  auto load_w = [&](WStage& w, int stage) {
#pragma unroll
    for (int i = 0; i < SB; ++i) {
      const int kb = stage * SB + i;
      w.lo[i] = w.hi[i] = make_uint2(0u, 0u);
      if (kb < n_kb) {
        if (lo_ok) w.lo[i] = __ldg(reinterpret_cast<const uint2*>(w_lo + 32 * kb));
        if (hi_ok) w.hi[i] = __ldg(reinterpret_cast<const uint2*>(w_hi + 32 * kb));
      }
    }
  };
  SplitSums<NT> sums;
  auto compute = [&](const WStage& w, int stage, int buf) {
#pragma unroll
    for (int i = 0; i < SB; ++i) {
      const int kb = stage * SB + i;
      if (kb >= n_kb) break;
      sums.advance_to(kb / per);
      const uint2 lo = w.lo[i], hi = w.hi[i];
      const uint32_t al0 = e4m3x2_to_f16x2(lo.x & 0xffffu), al1 = e4m3x2_to_f16x2(lo.x >> 16);
      const uint32_t al2 = e4m3x2_to_f16x2(lo.y & 0xffffu), al3 = e4m3x2_to_f16x2(lo.y >> 16);
      const uint32_t ah0 = e4m3x2_to_f16x2(hi.x & 0xffffu), ah1 = e4m3x2_to_f16x2(hi.x >> 16);
      const uint32_t ah2 = e4m3x2_to_f16x2(hi.y & 0xffffu), ah3 = e4m3x2_to_f16x2(hi.y >> 16);
      const float sw = e8m0_to_float(__ldg(sw_row + ((32 * kb) >> wb_shift)));
      const uint16_t* codes = xc_s + (buf * SB + i) * T * 32;
      const float* xs = xs_s + (buf * SB + i) * T;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n0 = 8 * nt + 2 * t4;
        const uint4 xb = *reinterpret_cast<const uint4*>(codes + (8 * nt + g) * 32 + 8 * t4);
        const float s0 = n0 < a.n_tokens ? sw * xs[n0] : 0.f;
        const float s1 = n0 + 1 < a.n_tokens ? sw * xs[n0 + 1] : 0.f;
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        mma_f16(c, al0, ah0, al1, ah1, xb.x, xb.y);
        mma_f16(c, al2, ah2, al3, ah3, xb.z, xb.w);
        sums.acc[nt][0] = fmaf(c[0], s0, sums.acc[nt][0]);
        sums.acc[nt][1] = fmaf(c[1], s1, sums.acc[nt][1]);
        sums.acc[nt][2] = fmaf(c[2], s0, sums.acc[nt][2]);
        sums.acc[nt][3] = fmaf(c[3], s1, sums.acc[nt][3]);
      }
    }
  };

  WStage w0;
  load_w(w0, 0);
  cuda::pdl_enter();
  walk_stages(n_stages, w0, load_w, issue_x, compute);
  sums.advance_to(splits);
  if (row0 < a.n_out) store_row_group<NT>(a, a.y, sums.total, row0);
}

// BF16 weights, PLANES bf16 planes of x (dense_gemv_mma.cu), plain or grouped (a group per blockIdx.y). Shared memory:
// x [2][SB][PLANES][T][32] bf16.
template <int NT, int PLANES>
__global__ void __launch_bounds__(kThreads, 1) gemv_bf16_mma_wide_kernel(GemvArgs a, int splits) {
  constexpr int SB = kBf16StageBlocks, T = 8 * NT;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* x_s = reinterpret_cast<uint16_t*>(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int row0 = (blockIdx.x * kWarps + warp) * 16, r_lo = row0 + g, r_hi = r_lo + 8;
  const bool lo_ok = r_lo < a.n_out, hi_ok = r_hi < a.n_out;
  const int n_kb = a.n_in / 32, per = (n_kb + splits - 1) / splits, n_stages = (n_kb + SB - 1) / SB;
  const int grp = blockIdx.y;
  const uint16_t* w = static_cast<const uint16_t*>(a.w) + grp * (a.w_group_nbytes / sizeof(uint16_t));
  const uint16_t* w_lo = w + static_cast<size_t>(lo_ok ? r_lo : 0) * a.n_in + 8 * t4;
  const uint16_t* w_hi = w + static_cast<size_t>(hi_ok ? r_hi : 0) * a.n_in + 8 * t4;
  const size_t plane = static_cast<size_t>(a.n_tokens) * a.ldx, x_col0 = static_cast<size_t>(grp) * a.x_group_off;
  float* y = a.y + static_cast<size_t>(grp) * a.y_group_off;

  auto issue_x = [&](int stage, int buf) {
    for (int c = threadIdx.x; c < SB * PLANES * T * 4; c += kThreads) {
      const int i = c / (PLANES * T * 4), p = (c / (T * 4)) % PLANES, n = (c >> 2) % T, q = c & 3, kb = stage * SB + i;
      const bool ok = n < a.n_tokens && kb < n_kb;
      cp_async16(smem_u32(x_s + (((buf * SB + i) * PLANES + p) * T + n) * 32 + 8 * q),
                 ok ? a.xc + p * plane + static_cast<size_t>(n) * a.ldx + x_col0 + 32 * kb + 8 * q : a.xc, ok);
    }
  };
  struct WStage {
    uint4 lo[SB], hi[SB];  // rows r_lo and r_hi, 8 weights each per k block
  };
  auto load_w = [&](WStage& w, int stage) {
#pragma unroll
    for (int i = 0; i < SB; ++i) {
      const int kb = stage * SB + i;
      w.lo[i] = w.hi[i] = make_uint4(0u, 0u, 0u, 0u);
      if (kb < n_kb) {
        if (lo_ok) w.lo[i] = __ldg(reinterpret_cast<const uint4*>(w_lo + 32 * kb));
        if (hi_ok) w.hi[i] = __ldg(reinterpret_cast<const uint4*>(w_hi + 32 * kb));
      }
    }
  };
  SplitSums<NT> sums;
  auto compute = [&](const WStage& w, int stage, int buf) {
#pragma unroll
    for (int i = 0; i < SB; ++i) {
      const int kb = stage * SB + i;
      if (kb >= n_kb) break;
      sums.advance_to(kb / per);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int p = 0; p < PLANES; ++p) {
          const uint4 xb =
              *reinterpret_cast<const uint4*>(x_s + (((buf * SB + i) * PLANES + p) * T + 8 * nt + g) * 32 + 8 * t4);
          mma_bf16(sums.acc[nt], w.lo[i].x, w.hi[i].x, w.lo[i].y, w.hi[i].y, xb.x, xb.y);
          mma_bf16(sums.acc[nt], w.lo[i].z, w.hi[i].z, w.lo[i].w, w.hi[i].w, xb.z, xb.w);
        }
    }
  };

  WStage w0;
  load_w(w0, 0);
  cuda::pdl_enter();
  walk_stages(n_stages, w0, load_w, issue_x, compute);
  sums.advance_to(splits);
  if (row0 < a.n_out) store_row_group<NT>(a, y, sums.total, row0);
}

template <class Kernel>
cudaError_t launch_wide(Kernel kernel, const GemvArgs& a, int splits, size_t smem, cudaStream_t stream) {
  // Above 48 KB a kernel must opt in; the attribute is the kernel's, so once per instantiation is enough.
  if (smem > 48 * 1024) {
    if (cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        e != cudaSuccess)
      return e;
  }
  const int row_groups = (a.n_out + 15) / 16;
  const dim3 grid(unsigned((row_groups + kWarps - 1) / kWarps), unsigned(a.n_groups));
  return cuda::launch(kernel, grid, dim3(kThreads), smem, stream, a, splits);
}

template <int NT>
cudaError_t launch_tiles(const GemvArgs& a, int splits, cudaStream_t stream) {
  constexpr size_t T = 8 * NT;
  if (a.format != DenseFormat::kBf16) {
    constexpr size_t smem = 2 * kFp8StageBlocks * T * (32 * sizeof(uint16_t) + sizeof(float));
    return launch_wide(gemv_mma_wide_kernel<NT>, a, splits, smem, stream);
  }
  if (a.x_planes == 1)
    return launch_wide(gemv_bf16_mma_wide_kernel<NT, 1>, a, splits, 2 * kBf16StageBlocks * T * 32 * sizeof(uint16_t),
                       stream);
  return launch_wide(gemv_bf16_mma_wide_kernel<NT, 3>, a, splits, 2 * kBf16StageBlocks * 3 * T * 32 * sizeof(uint16_t),
                     stream);
}

}  // namespace

cudaError_t gemv_mma_wide_launch(const GemvArgs& a, int splits, cudaStream_t stream) {
  if (a.n_tokens <= 16 || a.n_tokens > kGemvMmaMaxTokens) return cudaErrorInvalidValue;
  return a.n_tokens <= 32 ? launch_tiles<4>(a, splits, stream) : launch_tiles<8>(a, splits, stream);
}

}  // namespace spw::densedev
