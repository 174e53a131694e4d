// Tensor-core decode path of the FP8 dense linears (dense_linear.h, LinearPath::kGemv) for activation-quantized
// weights (act_block > 0), and of BF16 weights (below): y = x̂·Wᵀ for n_tokens ≤ kGemvMmaMaxTokens (64) with
// mma.sync m16n8k16 (f16 or bf16 inputs, f32 accumulation), the weight read once for all tokens.
//
// Why: x̂ = e4m3 code · 2^e per act_block and W = e4m3 code · 2^e per weight_block², so over a 32-wide k block
// (inside both scale blocks) Σ x̂·w = (s_x·s_w)·Σ code_x·code_w. Every e4m3 value is an f16 value, so the codes go
// into an f16 MMA exactly and their products are exact. The scalar GEMV (dense_gemv.cu) spent ~100–170 warp
// instructions per 512 weight bytes on conversions and FMAs and issued at 0.7 per scheduler cycle, 49–55 % of the
// HBM rate on wq_b/wo_b (bench/results/engine_h200.md); here 512 weights cost two 8-byte loads per
// lane, eight conversions and two MMAs.
//
// Layout. A warp owns 16 rows (a row group) and a k range; lane (g = lane/4, t = lane%4) loads 8 bytes of rows
// g and g + 8 at k = 32·kb + 8t. The MMA's k order is a permutation of the block's (the same for A and B): its
// logical k 2t + j is physical 8t + j in the first MMA and 8t + 4 + j in the second (j < 4 over a0/a2 and
// b0/b1), so B is 16 bytes of f16 codes of token g at the same k. C holds rows g, g + 8 and tokens 2t, 2t + 1
// (+ 8 per n tile); each k block's C (zeroed) is scaled by s_w·s_x(token) into an f32 accumulator.
// k splits: the k blocks of a row are cut into `splits` contiguous ranges (a function of n_in only), one warp
// each; the partial sums meet in shared memory and are added in split order. So a row's result depends on n_in
// alone — not on n_out, the token count (tokens are MMA columns, computed independently) or stacking.
// Token tiles: NT n tiles of 8 tokens per launch (1, 2, 4 or 8). Up to two tiles keep the next stage's x in registers;
// four and eight load each k block's x (L1/L2 hits: x is small) just before its MMAs, where staged registers would
// spill. Either way the per-token arithmetic is the same, so the bits do not depend on NT. Past 16 tokens, weights
// with enough rows to fill the GPU take dense_gemv_mma_wide.cu's kernels instead (the same bits; see
// gemv_mma_launch).
// Accuracy: exact products; f32 sums (MMA-internal over 32 k, then one per k block in k order, then the splits).
//
// BF16 weights (no activation quant; plain, or grouped as the attention's output projection: a group per
// blockIdx.y) take the same layout, k order and splits with bf16 MMAs on the weight as stored: a lane loads 16 bytes
// (8 weights) of rows g and g + 8 per k block, two MMAs. x enters as `planes` bf16 planes (GemvArgs::xc,
// [planes][n_tokens][ldx]): one when x is bf16-representable (the reference feeds BF16 linears bf16 activations),
// three for f32 products and the grouped projection (x = hi + mid + lo exactly: split3_bf16), each plane an MMA into the
// same f32 sum, so every product is exact and sums run in k order, planes in order within a k block. A row's result
// depends on n_in alone, as for FP8.
// Tests: tests/gpu/test_cuda_dense.cpp. Benchmark: bench/dense/bench_dense.cpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/dense/dense_device.cuh"
#include "cuda/dense/dense_mma.cuh"
#include "cuda/dense/dense_kernels.h"
#include "cuda/launch.h"

namespace spw::densedev {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kStageBlocks = 4;  // k blocks (of 32) per load stage; two stages in flight per warp

// The end of both kernels: the splits of a row group meet in shared memory, its first warp adds them in split
// order and stores the row group.
template <int NT>
__device__ __forceinline__ void finish_row_group(const GemvArgs& a, float* y, float (&acc)[NT][4], int splits, int row0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, split = warp % splits;
  __shared__ float part[kWarps][NT][4][32];
  if (splits > 1) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) part[warp][nt][j][lane] = acc[nt][j];
    __syncthreads();
    if (split != 0) return;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        for (int s = 1; s < splits; ++s) acc[nt][j] += part[warp + s][nt][j][lane];
  }
  if (row0 < a.n_out) store_row_group<NT>(a, y, acc, row0);
}

// x staged a stage ahead in registers up to two tiles; past that loaded per k block (see the top).
template <int NT>
constexpr bool kStageX = NT <= 2;

// NT n tiles of 8 tokens. Two blocks per SM at one tile (128 registers); from two tiles on one (two tiles' staged x̂
// spilled 512 bytes at two blocks).
template <int NT>
__global__ void __launch_bounds__(kThreads, NT == 1 ? 2 : 1) gemv_mma_kernel(GemvArgs a, int splits) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int rg = blockIdx.x * (kWarps / splits) + warp / splits, split = warp % splits;
  const int n_kb = a.n_in / 32, per = (n_kb + splits - 1) / splits;
  const int kb0 = min(n_kb, split * per), kb1 = min(n_kb, kb0 + per);
  const int row0 = rg * 16, r_lo = row0 + g, r_hi = r_lo + 8;
  const bool lo_ok = r_lo < a.n_out, hi_ok = r_hi < a.n_out;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const uint8_t* w_lo = w + static_cast<size_t>(lo_ok ? r_lo : 0) * a.n_in + 8 * t4;
  const uint8_t* w_hi = w + static_cast<size_t>(hi_ok ? r_hi : 0) * a.n_in + 8 * t4;
  const int wb_shift = __ffs(a.weight_block) - 1, ab_shift = __ffs(a.act_block) - 1;
  const int scale_cols = (a.n_in + a.weight_block - 1) >> wb_shift, xs_cols = a.n_in >> ab_shift;
  const uint8_t* sw_row = a.scale + static_cast<size_t>(row0 < a.n_out ? row0 >> wb_shift : 0) * scale_cols;

  // Weights are issued two stages ahead of their use; x̂ (codes and s_w·s_x of C's two columns, 0 past n_tokens)
  // comes from L1/L2, a stage ahead when staged (the first stage's only after the previous kernel has written it).
  struct XBlock {
    uint4 codes[NT];  // 8 f16 codes of token 8·nt + g at the lane's k
    float s[NT][2];
  };
  auto load_x_block = [&](XBlock& x, int kb) {
    const int b = min(kb, n_kb - 1);  // past the range: any valid block (never used)
    const float sw = e8m0_to_float(__ldg(sw_row + ((32 * b) >> wb_shift)));
    const int xs_col = (32 * b) >> ab_shift;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n = 8 * nt + g, n0 = 8 * nt + 2 * t4;
      x.codes[nt] = n < a.n_tokens
                        ? __ldg(reinterpret_cast<const uint4*>(a.xc + static_cast<size_t>(n) * a.n_in + 32 * b + 8 * t4))
                        : make_uint4(0u, 0u, 0u, 0u);
      x.s[nt][0] = n0 < a.n_tokens ? sw * __ldg(a.xs + static_cast<size_t>(n0) * xs_cols + xs_col) : 0.f;
      x.s[nt][1] = n0 + 1 < a.n_tokens ? sw * __ldg(a.xs + static_cast<size_t>(n0 + 1) * xs_cols + xs_col) : 0.f;
    }
  };
  using XStage = XBlock[kStageX<NT> ? kStageBlocks : 1];
  auto load_x = [&](XStage& x, int kb) {
    if constexpr (kStageX<NT>) {
#pragma unroll
      for (int i = 0; i < kStageBlocks; ++i) load_x_block(x[i], kb + i);
    }
  };
  auto load_w = [&](uint2 (&lo)[kStageBlocks], uint2 (&hi)[kStageBlocks], int kb) {
#pragma unroll
    for (int i = 0; i < kStageBlocks; ++i) {
      const int k = 32 * (kb + i);
      lo[i] = hi[i] = make_uint2(0u, 0u);
      if (kb + i < kb1) {
        if (lo_ok) lo[i] = __ldg(reinterpret_cast<const uint2*>(w_lo + k));
        if (hi_ok) hi[i] = __ldg(reinterpret_cast<const uint2*>(w_hi + k));
      }
    }
  };
  float acc[NT][4] = {};
  auto compute_stage = [&](const uint2 (&lo)[kStageBlocks], const uint2 (&hi)[kStageBlocks], const XStage& staged, int kb) {
#pragma unroll
    for (int i = 0; i < kStageBlocks; ++i) {
      if (kb + i >= kb1) break;
      const uint32_t al0 = e4m3x2_to_f16x2(lo[i].x & 0xffffu), al1 = e4m3x2_to_f16x2(lo[i].x >> 16);
      const uint32_t al2 = e4m3x2_to_f16x2(lo[i].y & 0xffffu), al3 = e4m3x2_to_f16x2(lo[i].y >> 16);
      const uint32_t ah0 = e4m3x2_to_f16x2(hi[i].x & 0xffffu), ah1 = e4m3x2_to_f16x2(hi[i].x >> 16);
      const uint32_t ah2 = e4m3x2_to_f16x2(hi[i].y & 0xffffu), ah3 = e4m3x2_to_f16x2(hi[i].y >> 16);
      auto mma_block = [&](const XBlock& x) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 xb = x.codes[nt];
          float c[4] = {0.f, 0.f, 0.f, 0.f};
          mma_f16(c, al0, ah0, al1, ah1, xb.x, xb.y);
          mma_f16(c, al2, ah2, al3, ah3, xb.z, xb.w);
          acc[nt][0] = fmaf(c[0], x.s[nt][0], acc[nt][0]);
          acc[nt][1] = fmaf(c[1], x.s[nt][1], acc[nt][1]);
          acc[nt][2] = fmaf(c[2], x.s[nt][0], acc[nt][2]);
          acc[nt][3] = fmaf(c[3], x.s[nt][1], acc[nt][3]);
        }
      };
      if constexpr (kStageX<NT>) {
        mma_block(staged[i]);
      } else {
        XBlock x;
        load_x_block(x, kb + i);
        mma_block(x);
      }
    }
  };

  uint2 lo0[kStageBlocks], hi0[kStageBlocks], lo1[kStageBlocks], hi1[kStageBlocks];
  XStage x0, x1;
  load_w(lo0, hi0, kb0);  // weights only: issued while the previous kernel may still be writing x̂
  cuda::pdl_enter();
  load_x(x0, kb0);
  for (int kb = kb0; kb < kb1;) {
    load_w(lo1, hi1, kb + kStageBlocks);
    load_x(x1, kb + kStageBlocks);
    compute_stage(lo0, hi0, x0, kb);
    if ((kb += kStageBlocks) >= kb1) break;
    load_w(lo0, hi0, kb + kStageBlocks);
    load_x(x0, kb + kStageBlocks);
    compute_stage(lo1, hi1, x1, kb);
    kb += kStageBlocks;
  }
  finish_row_group<NT>(a, a.y, acc, splits, row0);
}

// BF16 weights, PLANES bf16 planes of x (see the top). Two k blocks per stage: 64 weight bytes per lane, the FP8
// kernel's 32 of four blocks doubled, so both keep the same bytes in flight.
constexpr int kBf16StageBlocks = 2;
template <int NT, int PLANES>
__global__ void __launch_bounds__(kThreads, NT == 1 ? 2 : 1) gemv_bf16_mma_kernel(GemvArgs a, int splits) {
  constexpr int SB = kBf16StageBlocks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int rg = blockIdx.x * (kWarps / splits) + warp / splits, split = warp % splits;
  const int n_kb = a.n_in / 32, per = (n_kb + splits - 1) / splits;
  const int kb0 = min(n_kb, split * per), kb1 = min(n_kb, kb0 + per);
  const int row0 = rg * 16, r_lo = row0 + g, r_hi = r_lo + 8;
  const bool lo_ok = r_lo < a.n_out, hi_ok = r_hi < a.n_out;
  // Group blockIdx.y of a grouped weight (n_groups > 1): its weight, its columns of x's rows (ldx apart), its y.
  const int grp = blockIdx.y;
  const uint16_t* w = static_cast<const uint16_t*>(a.w) + grp * (a.w_group_nbytes / sizeof(uint16_t));
  const uint16_t* w_lo = w + static_cast<size_t>(lo_ok ? r_lo : 0) * a.n_in + 8 * t4;
  const uint16_t* w_hi = w + static_cast<size_t>(hi_ok ? r_hi : 0) * a.n_in + 8 * t4;
  const size_t plane = static_cast<size_t>(a.n_tokens) * a.ldx, x_col0 = static_cast<size_t>(grp) * a.x_group_off;
  float* y = a.y + static_cast<size_t>(grp) * a.y_group_off;

  auto load_w = [&](uint4 (&lo)[SB], uint4 (&hi)[SB], int kb) {
#pragma unroll
    for (int i = 0; i < SB; ++i) {
      const int k = 32 * (kb + i);
      lo[i] = hi[i] = make_uint4(0u, 0u, 0u, 0u);
      if (kb + i < kb1) {
        if (lo_ok) lo[i] = __ldg(reinterpret_cast<const uint4*>(w_lo + k));
        if (hi_ok) hi[i] = __ldg(reinterpret_cast<const uint4*>(w_hi + k));
      }
    }
  };
  // x planes of token 8·nt + g at the lane's 8 k of block kb (zero past n_tokens or the range).
  using XBlock = uint4[NT][PLANES];
  auto load_x_block = [&](XBlock& x, int kb) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n = 8 * nt + g;
      const bool ok = n < a.n_tokens && kb < kb1;
      const size_t at = static_cast<size_t>(n) * a.ldx + x_col0 + 32 * kb + 8 * t4;
#pragma unroll
      for (int p = 0; p < PLANES; ++p)
        x[nt][p] = ok ? __ldg(reinterpret_cast<const uint4*>(a.xc + p * plane + at)) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  using XStage = XBlock[kStageX<NT> ? SB : 1];
  auto load_x = [&](XStage& x, int kb) {
    if constexpr (kStageX<NT>) {
#pragma unroll
      for (int i = 0; i < SB; ++i) load_x_block(x[i], kb + i);
    }
  };
  float acc[NT][4] = {};
  auto compute_stage = [&](const uint4 (&lo)[SB], const uint4 (&hi)[SB], const XStage& staged, int kb) {
#pragma unroll
    for (int i = 0; i < SB; ++i) {
      if (kb + i >= kb1) break;
      auto mma_block = [&](const XBlock& x) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int p = 0; p < PLANES; ++p) {
            const uint4 xb = x[nt][p];
            mma_bf16(acc[nt], lo[i].x, hi[i].x, lo[i].y, hi[i].y, xb.x, xb.y);
            mma_bf16(acc[nt], lo[i].z, hi[i].z, lo[i].w, hi[i].w, xb.z, xb.w);
          }
      };
      if constexpr (kStageX<NT>) {
        mma_block(staged[i]);
      } else {
        XBlock x;
        load_x_block(x, kb + i);
        mma_block(x);
      }
    }
  };

  uint4 lo0[SB], hi0[SB], lo1[SB], hi1[SB];
  XStage x0, x1;
  load_w(lo0, hi0, kb0);  // weights only: issued while the previous kernel may still be writing x
  cuda::pdl_enter();
  load_x(x0, kb0);
  for (int kb = kb0; kb < kb1;) {
    load_w(lo1, hi1, kb + SB);
    load_x(x1, kb + SB);
    compute_stage(lo0, hi0, x0, kb);
    if ((kb += SB) >= kb1) break;
    load_w(lo0, hi0, kb + SB);
    load_x(x0, kb + SB);
    compute_stage(lo1, hi1, x1, kb);
    kb += SB;
  }
  finish_row_group<NT>(a, y, acc, splits, row0);
}

// The n tiles a launch of n_tokens takes: the fewest of 1, 2, 4, 8 that hold them.
template <template <int> class Launch, class... Args>
cudaError_t launch_by_tiles(int n_tokens, Args&&... args) {
  if (n_tokens <= 8) return Launch<1>::run(args...);
  if (n_tokens <= 16) return Launch<2>::run(args...);
  if (n_tokens <= 32) return Launch<4>::run(args...);
  return Launch<8>::run(args...);
}

template <int NT>
struct LaunchFp8 {
  static cudaError_t run(const GemvArgs& a, dim3 grid, int splits, cudaStream_t stream) {
    return cuda::launch(gemv_mma_kernel<NT>, grid, dim3(kThreads), 0, stream, a, splits);
  }
};
template <int PLANES>
struct LaunchBf16 {
  template <int NT>
  struct Tiles {
    static cudaError_t run(const GemvArgs& a, dim3 grid, int splits, cudaStream_t stream) {
      return cuda::launch(gemv_bf16_mma_kernel<NT, PLANES>, grid, dim3(kThreads), 0, stream, a, splits);
    }
  };
};

}  // namespace

bool gemv_uses_mma(DenseFormat format, int weight_block, int act_block, int n_in) {
  if (format == DenseFormat::kBf16) return act_block == 0 && n_in % 32 == 0;
  return format == DenseFormat::kFp8 && (weight_block == 32 || weight_block == 128) &&
         (act_block == 32 || act_block == 128) && n_in % 32 == 0;
}

int gemv_mma_k_splits(int n_in) {
  const int n_kb = n_in / 32;
  int s = kWarps;
  while (s > 1 && n_kb < 16 * s) s /= 2;  // at least 16 k blocks (four stages) per split where possible
  return s;
}

cudaError_t gemv_mma_launch(const GemvArgs& a, cudaStream_t stream) {
  const bool bf16 = a.format == DenseFormat::kBf16;
  if (!gemv_uses_mma(a.format, a.weight_block, a.act_block, a.n_in) || (a.n_groups != 1 && !bf16) || a.n_groups < 1 ||
      !a.xc || (!bf16 && !a.xs) || (bf16 && a.x_planes != 1 && a.x_planes != 3) || a.n_tokens < 1 ||
      a.n_tokens > kGemvMmaMaxTokens)
    return cudaErrorInvalidValue;
  const int splits = gemv_mma_k_splits(a.n_in), groups_per_block = kWarps / splits;
  // Past 16 tokens a weight of at least a block of 128 rows per SM takes the kernels that share x through shared
  // memory; smaller ones keep one warp per (row group, k split), which spreads them over more SMs. Measured on an
  // H100 at 64 tokens (bench/results/dense_h200.md), split warps against shared x: head 2330 / 1515 µs, wq_b 142 / 76
  // (wide enough), wo_b 172 / 206, wq_a 40 / 132, the router 36 / 194 (not).
  const int row_groups = (a.n_out + 15) / 16;
  if (a.n_tokens > 16 && (row_groups + kWarps - 1) / kWarps * a.n_groups >= sm_count())
    return gemv_mma_wide_launch(a, splits, stream);
  const dim3 grid(unsigned((row_groups + groups_per_block - 1) / groups_per_block), unsigned(a.n_groups));
  if (bf16 && a.x_planes == 1) return launch_by_tiles<LaunchBf16<1>::Tiles>(a.n_tokens, a, grid, splits, stream);
  if (bf16) return launch_by_tiles<LaunchBf16<3>::Tiles>(a.n_tokens, a, grid, splits, stream);
  return launch_by_tiles<LaunchFp8>(a.n_tokens, a, grid, splits, stream);
}

}  // namespace spw::densedev
