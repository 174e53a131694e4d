// Tensor-core decode path of the FP8 dense linears (dense_linear.h, LinearPath::kGemv) for activation-quantized
// weights (act_block > 0): y = x̂·Wᵀ for n_tokens ≤ 16 with mma.sync m16n8k16 (f16 inputs, f32 accumulation).
//
// Why: x̂ = e4m3 code · 2^e per act_block and W = e4m3 code · 2^e per weight_block², so over a 32-wide k block
// (inside both scale blocks) Σ x̂·w = (s_x·s_w)·Σ code_x·code_w. Every e4m3 value is an f16 value, so the codes go
// into an f16 MMA exactly and their products are exact. The scalar GEMV (dense_gemv.cu) spent ~100–170 warp
// instructions per 512 weight bytes on conversions and FMAs and issued at 0.7 per scheduler cycle, 49–55 % of the
// HBM rate on wq_b/wo_b (bench/results/engine_h200.md, session 12); here 512 weights cost two 8-byte loads per
// lane, eight conversions and two MMAs.
//
// Work. An item is a row group (16 rows) and a chunk of 16 k blocks (512 k). The grid is persistent (the blocks the
// GPU holds at once); warp w takes items w, w + W, … (W warps) and streams their stages without a break, the next
// stage's weights in flight while it computes the current one (the earlier form, one block per row group and k
// split, lost 1.3–1.8× to the scalar kernel at one token: wave tails and short-lived warps, session 12). A row
// group's chunks meet in global scratch: the last to arrive (a counter per row group, reset by that warp) adds
// them in chunk order. So a row's result depends on n_in alone — not on n_out, the grid, the token count (tokens
// are MMA columns, computed independently) or stacking.
// Layout. A warp computes 16 rows (a row group) over a k range; lane (g = lane/4, t = lane%4) loads 8 bytes of rows
// g and g + 8 at k = 32·kb + 8t. The MMA's k order is a permutation of the block's (the same for A and B): its
// logical k 2t + j is physical 8t + j in the first MMA and 8t + 4 + j in the second (j < 4 over a0/a2 and
// b0/b1), so B is 16 bytes of f16 codes of token g at the same k. C holds rows g, g + 8 and tokens 2t, 2t + 1
// (+ 8 per n tile); each k block's C (zeroed) is scaled by s_w·s_x(token) into an f32 accumulator.
// Accuracy: exact products; f32 sums (MMA-internal over 32 k, then one per k block in k order, then the chunks).
// Tests: tests/gpu/test_cuda_dense.cpp. Benchmark: bench/dense/bench_dense.cpp.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/dense/dense_device.cuh"
#include "cuda/dense/dense_kernels.h"
#include "cuda/launch.h"

#include <algorithm>

namespace spw::densedev {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kStageBlocks = 4;  // k blocks (of 32) per load stage; two stages in flight per warp
// A work item: one row group's k blocks [16c, 16c + 16) (chunk c). The chunks of a row are summed in chunk order,
// so the summation order depends on n_in alone.
constexpr int kChunkBlocks = 16, kItemStages = kChunkBlocks / kStageBlocks;

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

// NT n tiles of 8 tokens (1: ≤ 8 tokens, 2: ≤ 16). Two blocks per SM at one tile (128 registers); two tiles'
// x̂ stages need more registers than that (ptxas spilled 512 bytes), so one block.
template <int NT>
__global__ void __launch_bounds__(kThreads, NT == 1 ? 2 : 1) gemv_mma_kernel(GemvArgs a) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int n_kb = a.n_in / 32, n_chunks = (n_kb + kChunkBlocks - 1) / kChunkBlocks;
  const int n_rg = (a.n_out + 15) / 16;
  const long n_items = long(n_rg) * n_chunks, n_warps = long(gridDim.x) * kWarps;
  const long first = long(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int my_items = first < n_items ? int((n_items - 1 - first) / n_warps + 1) : 0;
  const int n_stages = my_items * kItemStages;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const int wb_shift = __ffs(a.weight_block) - 1, ab_shift = __ffs(a.act_block) - 1;
  const int scale_cols = (a.n_in + a.weight_block - 1) >> wb_shift, xs_cols = a.n_in >> ab_shift;

  // Stage s of this warp: item first + (s / kItemStages)·n_warps = (row group, chunk), its k blocks [kb, kb_end).
  struct Where {
    int rg, chunk, kb, kb_end;
  };
  auto where = [&](int s) {
    const long item = first + long(s / kItemStages) * n_warps;
    Where wh;
    wh.rg = int(item / n_chunks), wh.chunk = int(item % n_chunks);
    wh.kb = wh.chunk * kChunkBlocks + (s % kItemStages) * kStageBlocks;
    wh.kb_end = min(n_kb, (wh.chunk + 1) * kChunkBlocks);
    return wh;
  };
  struct XStage {
    uint4 codes[kStageBlocks][NT];  // 8 f16 codes of token 8·nt + g at the lane's k
    float s[kStageBlocks][NT][2];   // s_w·s_x of C's two columns (0 past n_tokens)
  };
  // A stage's weights (issued two stages ahead of their use) and its x̂ codes and scales (one stage ahead: they
  // come from L1/L2, and the first stage's only after the previous kernel has written them).
  auto load_w = [&](uint2 (&lo)[kStageBlocks], uint2 (&hi)[kStageBlocks], int s) {
    const bool in = s < n_stages;
    const Where wh = where(in ? s : 0);
    const int r_lo = wh.rg * 16 + g, r_hi = r_lo + 8;
    const uint8_t* w_lo = w + static_cast<size_t>(r_lo < a.n_out ? r_lo : 0) * a.n_in + 8 * t4;
    const uint8_t* w_hi = w + static_cast<size_t>(r_hi < a.n_out ? r_hi : 0) * a.n_in + 8 * t4;
#pragma unroll
    for (int i = 0; i < kStageBlocks; ++i) {
      lo[i] = hi[i] = make_uint2(0u, 0u);
      if (in && wh.kb + i < wh.kb_end) {
        if (r_lo < a.n_out) lo[i] = __ldg(reinterpret_cast<const uint2*>(w_lo + 32 * (wh.kb + i)));
        if (r_hi < a.n_out) hi[i] = __ldg(reinterpret_cast<const uint2*>(w_hi + 32 * (wh.kb + i)));
      }
    }
  };
  auto load_x = [&](XStage& x, int s) {
    const Where wh = where(s < n_stages ? s : 0);
    const uint8_t* sw_row = a.scale + static_cast<size_t>((wh.rg * 16) >> wb_shift) * scale_cols;
#pragma unroll
    for (int i = 0; i < kStageBlocks; ++i) {
      const int b = min(wh.kb + i, n_kb - 1);  // past the chunk: any valid block (never used)
      const float sw = e8m0_to_float(__ldg(sw_row + ((32 * b) >> wb_shift)));
      const int xs_col = (32 * b) >> ab_shift;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = 8 * nt + g, n0 = 8 * nt + 2 * t4;
        x.codes[i][nt] = n < a.n_tokens
                             ? __ldg(reinterpret_cast<const uint4*>(a.xc + static_cast<size_t>(n) * a.n_in + 32 * b + 8 * t4))
                             : make_uint4(0u, 0u, 0u, 0u);
        x.s[i][nt][0] = n0 < a.n_tokens ? sw * __ldg(a.xs + static_cast<size_t>(n0) * xs_cols + xs_col) : 0.f;
        x.s[i][nt][1] = n0 + 1 < a.n_tokens ? sw * __ldg(a.xs + static_cast<size_t>(n0 + 1) * xs_cols + xs_col) : 0.f;
      }
    }
  };
  float acc[NT][4] = {};
  auto compute_stage = [&](const uint2 (&lo)[kStageBlocks], const uint2 (&hi)[kStageBlocks], const XStage& x, int s) {
    const Where wh = where(s);
#pragma unroll
    for (int i = 0; i < kStageBlocks; ++i) {
      if (wh.kb + i >= wh.kb_end) break;
      const uint32_t al0 = e4m3x2_to_f16x2(lo[i].x & 0xffffu), al1 = e4m3x2_to_f16x2(lo[i].x >> 16);
      const uint32_t al2 = e4m3x2_to_f16x2(lo[i].y & 0xffffu), al3 = e4m3x2_to_f16x2(lo[i].y >> 16);
      const uint32_t ah0 = e4m3x2_to_f16x2(hi[i].x & 0xffffu), ah1 = e4m3x2_to_f16x2(hi[i].x >> 16);
      const uint32_t ah2 = e4m3x2_to_f16x2(hi[i].y & 0xffffu), ah3 = e4m3x2_to_f16x2(hi[i].y >> 16);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 xb = x.codes[i][nt];
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        mma_f16(c, al0, ah0, al1, ah1, xb.x, xb.y);
        mma_f16(c, al2, ah2, al3, ah3, xb.z, xb.w);
        acc[nt][0] = fmaf(c[0], x.s[i][nt][0], acc[nt][0]);
        acc[nt][1] = fmaf(c[1], x.s[i][nt][1], acc[nt][1]);
        acc[nt][2] = fmaf(c[2], x.s[i][nt][0], acc[nt][2]);
        acc[nt][3] = fmaf(c[3], x.s[i][nt][1], acc[nt][3]);
      }
    }
  };
  // After an item's last stage: one chunk per row stores its rows; otherwise the item's partial sums go to
  // a.partials and the row group's last arriving item (a.counters) adds the chunks in chunk order and stores.
  auto finish_item = [&](int s) {
    const Where wh = where(s);
    const int row0 = wh.rg * 16;
    auto out = [&](int nt, int j, float v) {
      const int row = row0 + g + (j < 2 ? 0 : 8), n = 8 * nt + 2 * t4 + (j & 1);
      if (row < a.n_out && n < a.n_tokens) store_output(a, a.y, row, n, v);
    };
    auto slot = [&](int chunk, int nt, int j) {  // [row group][chunk][16 rows][16 tokens]
      return (static_cast<size_t>(wh.rg) * n_chunks + chunk) * 256 + (g + (j < 2 ? 0 : 8)) * 16 + 8 * nt + 2 * t4 + (j & 1);
    };
    if (n_chunks == 1) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) out(nt, j, acc[nt][j]);
    } else {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) __stcg(a.partials + slot(wh.chunk, nt, j), acc[nt][j]);
      __threadfence();  // this lane's partials are visible before the warp's arrival is counted
      __syncwarp();
      int arrived = 0;
      if (lane == 0) arrived = atomicAdd(a.counters + wh.rg, 1);
      arrived = __shfl_sync(0xffffffffu, arrived, 0);
      if (arrived == n_chunks - 1) {  // the row group's last chunk: every partial is written
        __threadfence();
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float v = 0.f;
            for (int c = 0; c < n_chunks; ++c) v += __ldcg(a.partials + slot(c, nt, j));
            out(nt, j, v);
          }
        if (lane == 0) a.counters[wh.rg] = 0;  // clean for the next call (and graph replay)
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[nt][j] = 0.f;
  };

  uint2 lo0[kStageBlocks], hi0[kStageBlocks], lo1[kStageBlocks], hi1[kStageBlocks];
  XStage x0, x1;
  load_w(lo0, hi0, 0);  // weights only: issued while the previous kernel may still be writing x̂
  cuda::pdl_enter();
  if (n_stages == 0) return;
  load_x(x0, 0);
  for (int s = 0; s < n_stages;) {
    load_w(lo1, hi1, s + 1);
    load_x(x1, s + 1);
    compute_stage(lo0, hi0, x0, s);
    if (s % kItemStages == kItemStages - 1) finish_item(s);
    if (++s >= n_stages) break;
    load_w(lo0, hi0, s + 1);
    load_x(x0, s + 1);
    compute_stage(lo1, hi1, x1, s);
    if (s % kItemStages == kItemStages - 1) finish_item(s);
    ++s;
  }
}

// A persistent grid: the blocks the GPU holds at once (or fewer when the items are fewer).
template <int NT>
cudaError_t launch_persistent(const GemvArgs& a, long items, cudaStream_t stream) {
  const long resident = long(resident_blocks(gemv_mma_kernel<NT>)) * sm_count();
  const long blocks = std::min<long>(resident, (items + kWarps - 1) / kWarps);
  return cuda::launch(gemv_mma_kernel<NT>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, a);
}

}  // namespace

bool gemv_uses_mma(DenseFormat format, int weight_block, int act_block, int n_in) {
  return format == DenseFormat::kFp8 && (weight_block == 32 || weight_block == 128) &&
         (act_block == 32 || act_block == 128) && n_in % 32 == 0;
}

int gemv_mma_chunks(int n_in) { return (n_in / 32 + kChunkBlocks - 1) / kChunkBlocks; }

size_t gemv_mma_partials_floats(int n_out, int n_in) {
  const int chunks = gemv_mma_chunks(n_in);
  return chunks > 1 ? static_cast<size_t>((n_out + 15) / 16) * chunks * 256 : 0;
}

cudaError_t gemv_mma_launch(const GemvArgs& a, cudaStream_t stream) {
  if (!gemv_uses_mma(a.format, a.weight_block, a.act_block, a.n_in) || a.n_groups != 1 || !a.xc || !a.xs ||
      a.n_tokens < 1 || a.n_tokens > 16)
    return cudaErrorInvalidValue;
  const long row_groups = (a.n_out + 15) / 16, items = row_groups * gemv_mma_chunks(a.n_in);
  if (gemv_mma_chunks(a.n_in) > 1 && (!a.partials || !a.counters || row_groups > a.n_counters))
    return cudaErrorInvalidValue;
  if (a.n_tokens <= 8) return launch_persistent<1>(a, items, stream);
  return launch_persistent<2>(a, items, stream);
}

}  // namespace spw::densedev
