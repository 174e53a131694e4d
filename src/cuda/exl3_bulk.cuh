// The EXL3 bulk-copy GEMM block (exl3_gemm.cu's kBulk path) as device functions, shared by the one-tensor
// launches (exl3_gemm_cuda) and the grouped launches over many experts (exl3_grouped.cu).
//
// A block owns one 128-column group of one tensor over one k slice, for up to 8·G rows of x: a producer
// warp streams the trellis into a shared-memory ring by bulk copies (cp.async.bulk on the TMA engine),
// eight consumer warps decode each 16×16 tile in registers and multiply it with all rows on tensor cores
// (mma.m16n8k16, fp32 accumulation). Partial sums of the k slices meet in an fp32 accumulator in split
// order (split s adds after split s − 1 has, waiting on the column group's counter), so the sums never
// depend on timing and every run gives the same bits; the last split applies the output Hadamard, svh and
// bias and writes y. The wait cannot deadlock: split s − 1 of a column group has the lower block index,
// so it was dispatched first and runs to completion without waiting on later blocks.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/exl3_device.cuh"
#include "cuda/ops/device_numerics.cuh"  // round_bf16, as the engine's to_activation rounds

namespace spw::exl3dev {

constexpr int kThreads = 256;                     // the eight consumer warps
constexpr int kBulkThreads = kThreads + 32;       // plus the producer warp
constexpr int kBulkStages = 4, kBulkStageKt = 8;  // stages in the ring, k-tiles per stage
__host__ __device__ constexpr int bulk_ring_bytes(int K) { return kBulkStages * kBulkStageKt * 8 * 8 * K * 4; }

// One block's problem. Row r < m of the block is row `row(r)` of both acc and y: r itself, or
// row_map[row0 + r] when row_map is set (the grouped launches scatter an expert's rows this way).
struct BulkBlock {
  const uint16_t* trellis = nullptr;  // the whole tensor [k/16][n/16][16·K]
  const uint16_t* suh = nullptr;      // fp16 [k] (unused when x is already rotated)
  const uint16_t* svh = nullptr;      // fp16 [n]
  const uint16_t* bias = nullptr;     // fp16 [n] or null
  const void* x = nullptr;            // fp32 rows [m][k], or fp16 rows already rotated (kRotated)
  float* y = nullptr;                 // [rows][n]
  float* acc = nullptr;               // fp32 partial sums [rows][n]: zero on entry; may be y itself
  uint32_t* counter = nullptr;        // this column group's splits done: zero on entry, left zero
  const int32_t* row_map = nullptr;
  int row0 = 0;
  int k = 0, n = 0, m = 0;
  int kpb = 0;                        // k per slice (multiple of 128)
  int group = 0, split = 0, n_splits = 1;
  bool round_out = false;             // y rounded to bf16 as it is written
  bool clean_acc = true;              // zero acc again after reading it (false when acc is y)

  __device__ __forceinline__ int64_t row(int r) const { return row_map ? row_map[row0 + r] : row0 + r; }
};

// Blocks until the column group's counter reaches `turn` (its splits before this one have added), then
// every thread of the block sees their sums (acquire by thread 0, then the block barrier).
__device__ __forceinline__ void wait_for_turn(const uint32_t* counter, uint32_t turn) {
  if (threadIdx.x == 0) {
    uint32_t v;
    for (;;) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
      if (v == turn) break;
      __nanosleep(32);
    }
  }
  __syncthreads();
}

// Partial sums of one warp's 16-column strip (tile accumulators of G 8-token groups, exl3_device.cuh:
// tile_mma; group h holds tokens 8h..8h+7) are added into acc in split order; the last split applies the
// output Hadamard, svh and bias and writes y. All threads of the block call this; `has_strip` is false for
// threads that computed nothing (the producer warp). G ≥ 8 needs stage_smem: 4 KB per token group of
// shared memory no warp reads any more.
template <int G>
__device__ __forceinline__ void finish_column_group(const BulkBlock& b, const float (*c)[4], bool has_strip, int tn,
                                                    void* stage_smem = nullptr) {
  constexpr int kRows = 8 * G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t4 = lane & 3, g = lane >> 2;
  const int col = tn * 16 + g;
  const int n = b.n, m = b.m;
  const bool is_last = b.split == b.n_splits - 1;
  if constexpr (G >= 8) {
    // 64 or 96 rows: the block's [8G][128] partial goes through shared memory (the ring's and x slice's
    // space, free once every warp is done) and into acc as float4, a quarter of the scalar accesses.
    __syncthreads();
    float* stage = reinterpret_cast<float*>(stage_smem);
    if (has_strip)
#pragma unroll
      for (int h = 0; h < G; ++h)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int tok = 8 * h + 2 * t4 + j, sc = (tn % 8) * 16 + g;
          stage[tok * 128 + sc] = c[h][j];
          stage[tok * 128 + sc + 8] = c[h][2 + j];
        }
    wait_for_turn(b.counter, b.split);  // its barrier also publishes the staged partial
    for (int i = threadIdx.x; i < m * 32; i += blockDim.x) {
      const int tok = i >> 5, c4 = i & 31;
      float4* a = reinterpret_cast<float4*>(b.acc + b.row(tok) * n + b.group * 128) + c4;
      const float4 p = reinterpret_cast<const float4*>(stage + tok * 128)[c4], v = __ldcg(a);
      __stcg(a, make_float4(v.x + p.x, v.y + p.y, v.z + p.z, v.w + p.w));
    }
  } else {
    wait_for_turn(b.counter, b.split);
    if (has_strip) {
#pragma unroll
      for (int h = 0; h < G; ++h) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int tok = 8 * h + 2 * t4 + j;
          if (tok < m) {
            float* a = b.acc + b.row(tok) * n;
            __stcg(a + col, __ldcg(a + col) + c[h][j]);
            __stcg(a + col + 8, __ldcg(a + col + 8) + c[h][2 + j]);
          }
        }
      }
    }
  }
  __threadfence();
  __syncthreads();
  if (!is_last) {
    if (threadIdx.x == 0) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(b.counter), "r"(b.split + 1) : "memory");
    return;
  }
  for (int r = warp; r < m && r < kRows; r += blockDim.x / 32) {
    const int64_t row = b.row(r);
    float* a = b.acc + row * n + b.group * 128;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = __ldcg(a + lane + 32 * e);
    had128_warp(v, lane);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int cc = b.group * 128 + lane + 32 * e;
      float out = v[e] * __half2float(__ushort_as_half(b.svh[cc]));
      if (b.bias) out += __half2float(__ushort_as_half(b.bias[cc]));
      if (b.clean_acc) __stcg(a + lane + 32 * e, 0.0f);
      b.y[row * n + cc] = b.round_out ? cuda::dev::round_bf16(out) : out;
    }
  }
  if (threadIdx.x == 0) *b.counter = 0;
}

// xs[row][i] = fp16(had128(x[row][k0 + i] · suh[k0 + i])) for i < klen, rows < kRows (rows ≥ m zero),
// row stride ld halves; all warps of the block share the 128-blocks.
template <int kRows>
__device__ __forceinline__ void rotate_slice(const float* __restrict__ x, const uint16_t* __restrict__ suh, half* xs,
                                             int ld, int k, int k0, int klen, int m) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  const int nblk = klen / 128;
  for (int job = warp; job < kRows * nblk; job += n_warps) {
    const int row = job / nblk, blk = job % nblk;
    half* dst = xs + row * ld + blk * 128;
    float v[4];
    if (row < m) {
      const float* src = x + static_cast<size_t>(row) * k + k0 + blk * 128;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        v[e] = src[lane + 32 * e] * __half2float(__ushort_as_half(suh[k0 + blk * 128 + lane + 32 * e]));
      had128_warp(v, lane);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[lane + 32 * e] = __float2half_rn(v[e]);
  }
}

// The block: kRotated = x holds fp16 rows already rotated (exl3_rotate_rows_cuda or the grouped
// rotation), copied into shared memory by cp.async; otherwise the block rotates its slice of fp32 x.
// G = 8-token groups (1, 2, 8 or 12): every tile is decoded once and multiplied with all 8·G rows; for
// G ≥ 2 the x fragments come from shared memory by ldmatrix (two groups per ldmatrix.x4).
// Dynamic shared memory: bulk_ring_bytes(K) + 2·8G·(kpb + 8) bytes, 16-byte aligned.
template <int K, int CB, int G, bool kRotated>
__device__ __forceinline__ void bulk_gemm_block(const BulkBlock& b, unsigned char* smem_raw) {
  static_assert(G == 1 || G % 2 == 0, "groups come in pairs past the first");
  constexpr int kRows = 8 * G;
  constexpr int kWords = 8 * K;          // uint32 per tile
  constexpr int kRowWords = 8 * kWords;  // one k-tile row of the column group
  constexpr int kStageWords = kBulkStageKt * kRowWords;
  uint32_t* ring = reinterpret_cast<uint32_t*>(smem_raw);
  half* xs = reinterpret_cast<half*>(smem_raw + bulk_ring_bytes(K));
  __shared__ __align__(8) uint64_t full[kBulkStages], empty[kBulkStages];
  const int ld = b.kpb + 8;  // halves; rows 16 bytes apart mod 128, so ldmatrix rows hit distinct banks
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int k0 = b.split * b.kpb, klen = min(b.kpb, b.k - k0);
  const int n_stages = klen / (16 * kBulkStageKt);  // klen is a multiple of 128
  const int n_tn = b.n / 16;
  const bool producer = warp == kThreads / 32;

  if (threadIdx.x == 0) {
    for (int st = 0; st < kBulkStages; ++st) {
      mbar_init(&full[st], 1);
      mbar_init(&empty[st], kThreads / 32);
    }
    mbar_fence_init();
  }
  __syncthreads();

  const char* src = reinterpret_cast<const char*>(b.trellis) +
                    (static_cast<size_t>(k0 / 16) * n_tn + b.group * 8) * kWords * 4;
  const size_t row_stride = static_cast<size_t>(n_tn) * kWords * 4;
  auto issue = [&](int st) {  // producer lane 0 only
    const int slot = st % kBulkStages;
    mbar_expect_tx(&full[slot], kStageWords * 4);
    for (int r = 0; r < kBulkStageKt; ++r)
      bulk_copy(ring + slot * kStageWords + r * kRowWords,
                src + static_cast<size_t>(st * kBulkStageKt + r) * row_stride, kRowWords * 4, &full[slot]);
  };
  // The first stages fly while the block rotates (or copies) its slice of x.
  if (producer && lane == 0)
    for (int st = 0; st < kBulkStages && st < n_stages; ++st) issue(st);
  if constexpr (kRotated) {
    const __half* xr = static_cast<const __half*>(b.x);
    const int pieces = klen / 8;  // 16-byte pieces per row
    for (int i = threadIdx.x; i < b.m * pieces; i += blockDim.x) {
      const int row = i / pieces, p = i % pieces;
      cp_async16(smem_addr(xs + row * ld + p * 8), xr + static_cast<size_t>(row) * b.k + k0 + p * 8);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
  } else {
    rotate_slice<kRows>(static_cast<const float*>(b.x), b.suh, xs, ld, b.k, k0, klen, b.m);
  }
  __syncthreads();

  float c[G][4] = {};
  if (producer) {
    if (lane == 0)
      for (int st = kBulkStages; st < n_stages; ++st) {
        mbar_wait(&empty[st % kBulkStages], (st / kBulkStages - 1) & 1);
        issue(st);
      }
  } else {
    const LaneWindow lw = lane_window<K>(lane);
    const int t4 = lane & 3, g = lane >> 2;
    // ldmatrix row of this lane (G ≥ 2): token (lane/16)·8 + lane%8 of a 16-token pair of groups, k offset
    // 8·((lane/8)%2) within the tile; matrices 0..3 = (group 2i, k 0-7), (2i, k 8-15), (2i+1, ...), (2i+1, ...).
    const unsigned xs_lane =
        smem_addr(xs) + 2u * static_cast<unsigned>((((lane >> 4) * 8 + (lane & 7)) * ld) + ((lane >> 3) & 1) * 8);
#pragma unroll 1
    for (int st = 0; st < n_stages; ++st) {
      const int slot = st % kBulkStages;
      mbar_wait(&full[slot], (st / kBulkStages) & 1);
      const uint32_t* tw = ring + slot * kStageWords + warp * kWords;
      const int kcol = st * kBulkStageKt * 16;  // the stage's first k within the slice
#pragma unroll
      for (int r = 0; r < kBulkStageKt; ++r) {
        const uint32_t* t = tw + r * kRowWords;
        uint32_t w[4];
        tile_fragment<K, CB>(t[lw.wa], t[lw.wb], t[lw.wc], lw.off, w);
        if constexpr (G == 1) {
          const half* xrr = xs + g * ld + kcol + r * 16 + 2 * t4;
          mma16816(c[0], w[0], w[1], w[2], w[3], *reinterpret_cast<const uint32_t*>(xrr),
                   *reinterpret_cast<const uint32_t*>(xrr + 8));
        } else {
#pragma unroll
          for (int pg = 0; pg < G / 2; ++pg) {
            uint32_t xf[4];
            ldmatrix_x4(xs_lane + 2u * static_cast<unsigned>(pg * 16 * ld + kcol + r * 16), xf);
            mma16816(c[2 * pg], w[0], w[1], w[2], w[3], xf[0], xf[1]);
            mma16816(c[2 * pg + 1], w[0], w[1], w[2], w[3], xf[2], xf[3]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
    }
  }
  finish_column_group<G>(b, c, !producer, b.group * 8 + (producer ? 0 : warp),
                         smem_raw);  // ring + x slice: ≥ 4 KB per token group for any K and slice
}

}  // namespace spw::exl3dev
