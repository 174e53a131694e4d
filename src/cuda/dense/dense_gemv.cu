// Decode path of the dense linears (dense_linear.h, LinearPath::kGemv): y = x̂·Wᵀ for n_tokens ≤ 16,
// streaming the compact weight once. Three kernels, one arithmetic:
//
// Lane l of a warp owns elements [16l, 16l+16) of every 512-wide k tile of its R rows: it dequantizes
// them into registers (one 16-byte fp8 load, 8-byte fp4, 32-byte bf16, 64-byte f32 per row: coalesced
// across the warp) and accumulates T·R dot products in fp32, tile after tile, element by element; a
// warp butterfly sums the lanes at the end. All kernels keep exactly this per-lane order, so they
// give bit-identical results, whatever R and the tiles per round (T is fixed by n_tokens).
//
// gemv_stream_kernel (1 or 2 tokens: every decode step of a single sequence): no shared memory and no
//   barriers. x̂ is read straight from global memory (L1-cached: the block's warps read the same
//   values), and the chunks of the next round are loaded before the current round is computed (two
//   register buffers), so a warp always has a round of weight loads in flight. The staged kernel
//   below waited for each round's loads before issuing the next (a memory latency per round): 26 %
//   of HBM bandwidth over the V4.1 decode's FP8 weights (bench/results/engine_h200.md).
// gemv_persist_kernel (1 or 2 tokens, unsplit matrices of more than one wave of blocks): the streaming
//   kernel's arithmetic on a grid of resident blocks, each warp streaming several row groups in a row.
// gemv_kernel (more tokens): x̂ of a round is staged in shared memory once for the block's 8 warps
//   (rows padded 4 floats per 16, so the 16-float chunks of consecutive lanes fall on distinct banks);
//   each round issues all its weight loads, stages x̂ while they fly, then accumulates.
//
// Launch shape: grid (ceil(n_out / (8·R)), n_groups, S), 256 threads = 8 warps; warp w of block b owns
// rows [(8b + w)·R, +R). T (tokens, templated 1/2/4/8/16, rows ≥ n_tokens masked to zero) and R
// (1/2/4) are chosen by the launcher. Matrices with fewer rows than two blocks per SM of 4-row warps
// split k over S = 2 or 4 blocks of a cluster; the partial sums are added in rank order in the cluster's
// rank-0 block. S follows from the shape alone, so every kernel and token count of a weight adds in the
// same order.
// Accuracy: exact products (x̂, W bf16-representable), fp32 sums in lane-then-butterfly order. FP8 chunks
// fold their scale into x̂ (dense_device.cuh: kFoldsScale), which the rows of a warp share.
// Tests: tests/gpu/test_cuda_dense.cpp. Benchmark: bench/dense/bench_dense.cpp.
#include <cooperative_groups.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "cuda/launch.h"
#include "cuda/dense/dense_device.cuh"
#include "cuda/dense/dense_kernels.h"

namespace spw::densedev {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kTileK = 512, kTilePad = kTileK / 16 * 20;

// Tiles staged per round: more weight loads in flight per lane on small-T launches (U·R chunks of
// raw bytes in registers), bounded by registers (U·R ≤ 8) and the x staging (T·U ≤ 16 tiles: 40 KiB).
template <int T, int R>
__host__ __device__ constexpr int tiles_per_round() {
  constexpr int by_tokens = T <= 2 ? 8 : T <= 4 ? 4 : T <= 8 ? 2 : 1;
  constexpr int by_rows = 8 / R;
  return by_tokens < by_rows ? by_tokens : by_rows;
}

// The k range of this block: with S > 1 the S blocks of a cluster (blockIdx.z = its rank) take
// consecutive ranges of whole 512-wide tiles, so a narrow matrix still spreads over every SM (a 512-row
// wkv is 64 blocks of 8 rows; each warp walked 10 tiles one after the other).
struct KRange {
  int begin, end;
};
template <int S>
__device__ __forceinline__ KRange k_range(int n_in) {
  if constexpr (S == 1) {
    return {0, n_in};
  } else {
    const int per = ((n_in + kTileK - 1) / kTileK + S - 1) / S * kTileK, s = int(blockIdx.z);
    return {min(n_in, s * per), min(n_in, (s + 1) * per)};
  }
}

// What a warp of either kernel works on: its group's x̂ and y, its R rows (warp w of block b owns
// rows [(8b + w)·R, +R)), their addresses, and the block's k range.
template <DenseFormat F, int R, int S>
struct WarpRows {
  const float* x;
  float* y;
  int row0;
  RowSource<F> src[R];
  KRange kr;
  __device__ __forceinline__ explicit WarpRows(const GemvArgs& a) : kr(k_range<S>(a.n_in)) {
    const int g = blockIdx.y;
    const void* w = static_cast<const uint8_t*>(a.w) + g * a.w_group_nbytes;
    x = a.x + static_cast<size_t>(g) * a.x_group_off;
    y = a.y + static_cast<size_t>(g) * a.y_group_off;
    row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * R;
#pragma unroll
    for (int r = 0; r < R; ++r) src[r] = row_source<F>(w, a.scale, row0 + r, a.n_in, a.weight_block);
  }
};

// The round at k0 of rows row0 .. row0 + R − 1 into c: U tiles of the lane's 16-element chunks; zero chunks
// at or past k_end and for rows at or past n_out.
template <DenseFormat F, int U, int R>
__device__ __forceinline__ void load_round_chunks(Chunk<F> (&c)[U][R], const RowSource<F> (&src)[R], int k0, int k_end,
                                                  int row0, int n_out, int lane) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int k = k0 + u * kTileK + 16 * lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      c[u][r] = Chunk<F>{};
      if (k < k_end && row0 + r < n_out) c[u][r] = load_chunk<F>(src[r], k);
    }
  }
}

// Sums acc over the warp's lanes and writes rows [row0, row0 + R) of y (lane 0). With S > 1 the block
// holds a partial sum over its k range: the cluster's S partials of a row meet in rank 0's shared memory
// and are added in rank order (distributed shared memory), so a row's sum depends on the split alone.
template <int R, int T, int S>
__device__ __forceinline__ void finish_rows(const GemvArgs& a, float (&acc)[R][T], float* y, int row0, int lane) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], off);
  auto store = [&](int row, int t, float v) { store_output(a, y, row, t, v); };
  if constexpr (S == 1) {
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= a.n_out) break;
#pragma unroll
      for (int t = 0; t < T; ++t)
        if (t < a.n_tokens) store(row0 + r, t, acc[r][t]);
    }
  } else {
    namespace cg = cooperative_groups;
    __shared__ float part[kWarps][R][T];
    const int warp = threadIdx.x >> 5;
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) part[warp][r][t] = acc[r][t];
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's partials are written
    if (cluster.block_rank() == 0) {
      const int block_row0 = int(blockIdx.x) * kWarps * R;
      for (int i = threadIdx.x; i < kWarps * R * T; i += kThreads) {
        const int row = block_row0 + i / T, t = i % T;
        if (row >= a.n_out || t >= a.n_tokens) continue;
        const float* p0 = &part[0][0][0] + i;
        float v = *cluster.map_shared_rank(p0, 0);
#pragma unroll
        for (int r = 1; r < S; ++r) v += *cluster.map_shared_rank(p0, r);
        store(row, t, v);
      }
    }
    cluster.sync();  // rank 0 has read the other blocks' partials before they exit
  }
}

template <DenseFormat F, int T, int R, int S>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
  cuda::pdl_enter();
  constexpr int U = tiles_per_round<T, R>();
  __shared__ __align__(16) float xs[T][U * kTilePad];
  const int lane = threadIdx.x & 31;
  const WarpRows<F, R, S> wr(a);
  const KRange& kr = wr.kr;
  const float* x = wr.x;
  const RowSource<F>(&src)[R] = wr.src;
  float acc[R][T] = {};

  // A round covers U tiles of 512: issue every weight load of the round, stage x for all of them while
  // those loads are in flight (the weights do not wait for x), then accumulate tile by tile — the same
  // per-lane order as one tile per round.
  for (int k0 = kr.begin; k0 < kr.end; k0 += U * kTileK) {
    Chunk<F> chunks[U][R];
    load_round_chunks<F, U, R>(chunks, src, k0, kr.end, wr.row0, a.n_out, lane);

    __syncthreads();  // the previous round's x is consumed
    for (int i = threadIdx.x; i < T * U * (kTileK / 4); i += kThreads) {
      const int t = i / (U * kTileK / 4), c = (i % (U * kTileK / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t < a.n_tokens && k0 + c < kr.end) v = *reinterpret_cast<const float4*>(x + static_cast<size_t>(t) * a.ldx + k0 + c);
      *reinterpret_cast<float4*>(&xs[t][c + (c / 16) * 4]) = v;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + u * kTileK + 16 * lane;
      if (k >= kr.end) break;  // later tiles of the round are past the end too
      float wv[R][16];
#pragma unroll
      for (int r = 0; r < R; ++r) weight_values<F>(chunks[u][r], wv[r]);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float xv[16];
        const float4* xp = reinterpret_cast<const float4*>(&xs[t][u * kTilePad + 20 * lane]);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float4 v = xp[q];
          xv[4 * q] = v.x, xv[4 * q + 1] = v.y, xv[4 * q + 2] = v.z, xv[4 * q + 3] = v.w;
        }
        scale_x<F>(chunks[u][0], xv);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < 16; ++j) acc[r][t] = fmaf(wv[r][j], xv[j], acc[r][t]);
      }
    }
  }

  finish_rows<R, T, S>(a, acc, wr.y, wr.row0, lane);
}

// Tiles per round of the streaming kernels: U·R = 4 chunks per buffer, two buffers in flight.
template <int R>
__host__ __device__ constexpr int stream_tiles_per_round() {
  return 4 / R;
}

// acc[r][t] += the round at k0 (U tiles of R rows' chunks c) times x̂ of token t, element by element: the
// per-lane order every GEMV kernel keeps. Tiles at or past k_end are skipped.
template <DenseFormat F, int T, int R, int U>
__device__ __forceinline__ void accumulate_round(const Chunk<F> (&c)[U][R], const float* x, const GemvArgs& a, int k0,
                                                 int k_end, int lane, float (&acc)[R][T]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int k = k0 + u * kTileK + 16 * lane;
    if (k >= k_end) break;  // later tiles of the round are past the end too
    // Every x̂ load of the tile is issued before the first is used: token 0 always exists (n_tokens ≥ 1), and a
    // later token past n_tokens reads token 0's row instead of being predicated off (its sums are never
    // written). With a predicated load per float4, ptxas issued each load right before its use: four L1
    // round trips per tile in a row (bench/results/engine_h200.md).
    float4 xq[T][4];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float4* xp = reinterpret_cast<const float4*>(x + static_cast<size_t>(t < a.n_tokens ? t : 0) * a.ldx + k);
#pragma unroll
      for (int q = 0; q < 4; ++q) xq[t][q] = __ldg(xp + q);
    }
    float xv[T][16];
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        xv[t][4 * q] = xq[t][q].x, xv[t][4 * q + 1] = xq[t][q].y, xv[t][4 * q + 2] = xq[t][q].z, xv[t][4 * q + 3] = xq[t][q].w;
      scale_x<F>(c[u][0], xv[t]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float wv[16];
      weight_values<F>(c[u][r], wv);
#pragma unroll
      for (int t = 0; t < T; ++t)
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[r][t] = fmaf(wv[j], xv[t][j], acc[r][t]);
    }
  }
}

template <DenseFormat F, int T, int R, int S>
__global__ void __launch_bounds__(kThreads) gemv_stream_kernel(GemvArgs a) {
  constexpr int U = stream_tiles_per_round<R>(), kRoundK = U * kTileK;
  const int lane = threadIdx.x & 31;
  const WarpRows<F, R, S> wr(a);
  const KRange& kr = wr.kr;
  const float* x = wr.x;
  const RowSource<F>(&src)[R] = wr.src;
  float acc[R][T] = {};

  // The round starting at k0 into c (zero chunks past the row's end or the last row).
  auto load_round = [&](Chunk<F> (&c)[U][R], int k0) { load_round_chunks<F, U, R>(c, src, k0, kr.end, wr.row0, a.n_out, lane); };
  auto compute_round = [&](const Chunk<F> (&c)[U][R], int k0) { accumulate_round<F, T, R, U>(c, x, a, k0, kr.end, lane, acc); };

  // Ping-pong over two buffers (no copies): load the next round, then compute the current one.
  Chunk<F> buf0[U][R], buf1[U][R];
  load_round(buf0, kr.begin);  // weights only: issued while the previous kernel may still be writing x̂
  cuda::pdl_enter();
  for (int k0 = kr.begin; k0 < kr.end;) {
    load_round(buf1, k0 + kRoundK);
    compute_round(buf0, k0);
    if ((k0 += kRoundK) >= kr.end) break;
    load_round(buf0, k0 + kRoundK);
    compute_round(buf1, k0);
    k0 += kRoundK;
  }
  finish_rows<R, T, S>(a, acc, wr.y, wr.row0, lane);
}

// gemv_persist_kernel (1–2 tokens, unsplit matrices with more row blocks than the GPU holds at once:
// wq_b, the head): a grid of the resident blocks only; warp i takes row groups i, i + W, i + 2W, ... (W
// warps in the grid) and streams all their rounds as one sequence, loading the next round while it
// computes this one, across row-group boundaries. The stream kernel restarts its pipeline per row group:
// wq_b's rows are 2.5 tiles, so each warp got 3 rounds (a memory latency each) in two waves of blocks:
// 21 µs for 42 MB on the H200 (bench/results/dense_h200.md). Same per-lane order as the others.
// Blocks per SM the persistent kernel is compiled for: one token of FP8 fits 80 registers without spilling,
// three blocks per SM (94 registers unbounded: two), more weight bytes in flight for wq_b; the others two
// (≤ 128 registers, what they took unbounded). An explicit 1 let ptxas take 155 for the bf16 head: one block.
template <DenseFormat F, int T>
constexpr int persist_min_blocks() {
  return F == DenseFormat::kFp8 && T == 1 ? 3 : 2;
}

template <DenseFormat F, int T, int R>
__global__ void __launch_bounds__(kThreads, persist_min_blocks<F, T>()) gemv_persist_kernel(GemvArgs a) {
  constexpr int U = stream_tiles_per_round<R>(), kRoundK = U * kTileK;
  const int lane = threadIdx.x & 31, g = blockIdx.y;
  const void* w = static_cast<const uint8_t*>(a.w) + g * a.w_group_nbytes;
  const float* x = a.x + static_cast<size_t>(g) * a.x_group_off;
  float* y = a.y + static_cast<size_t>(g) * a.y_group_off;
  const int n_warps = gridDim.x * kWarps, first = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int n_row_groups = (a.n_out + R - 1) / R, rounds = (a.n_in + kRoundK - 1) / kRoundK;
  const int n_items = first < n_row_groups ? ((n_row_groups - 1 - first) / n_warps + 1) * rounds : 0;
  auto row0_of = [&](int item) { return (first + (item / rounds) * n_warps) * R; };
  auto load_item = [&](Chunk<F> (&c)[U][R], int item) {
    const int row0 = row0_of(item);
    RowSource<F> src[R];
#pragma unroll
    for (int r = 0; r < R; ++r) src[r] = row_source<F>(w, a.scale, row0 + r, a.n_in, a.weight_block);
    load_round_chunks<F, U, R>(c, src, (item % rounds) * kRoundK, a.n_in, row0, item < n_items ? a.n_out : 0, lane);
  };
  float acc[R][T] = {};
  auto compute_item = [&](const Chunk<F> (&c)[U][R], int item) {
    accumulate_round<F, T, R, U>(c, x, a, (item % rounds) * kRoundK, a.n_in, lane, acc);
    if (item % rounds == rounds - 1) {  // the row group is complete
      finish_rows<R, T, 1>(a, acc, y, row0_of(item), lane);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
    }
  };

  Chunk<F> buf0[U][R], buf1[U][R];
  load_item(buf0, 0);  // weights only, before the previous kernel has finished
  cuda::pdl_enter();
  for (int i = 0; i < n_items;) {
    load_item(buf1, i + 1);
    compute_item(buf0, i);
    if (++i >= n_items) break;
    load_item(buf0, i + 1);
    compute_item(buf1, i);
    ++i;
  }
}



// Rows per warp: as many as still give every SM `blocks_per_sm` blocks of 8 warps.
int rows_per_warp(long rows, int blocks_per_sm) {
  const long per_r = long(blocks_per_sm) * kWarps * sm_count();
  return rows >= 4 * per_r ? 4 : rows >= 2 * per_r ? 2 : 1;
}

// k splits (blocks of a cluster per row block): none when the rows alone give every SM two blocks of
// 4-row warps; else up to 4, as long as every split keeps ≥ 2 tiles. A function of the shape only —
// never of n_tokens — because the split decides the summation order, and a row must come out
// bit-identical whichever kernel and token count computed it. Splitting is what lets a mid-sized matrix
// take 4 rows per warp: with one row per warp, each warp re-read x̂ from L1 for every 16 weight bytes
// (64 bytes of x̂ per fp8 chunk), and the L1 traffic, not HBM, bounded the GEMV (a kernel profile).
int k_splits(long rows, int n_in) {
  const long enough = 2L * kWarps * sm_count();
  if (rows >= 4 * enough) return 1;
  const int tiles = (n_in + kTileK - 1) / kTileK;
  int s = 1;
  while (s < 4 && tiles >= 4 * s) s *= 2;
  return s;
}

// The streaming kernel for 1–2 tokens, except F32 weights (a 64-byte chunk: two buffers of them do not
// fit the registers).
template <DenseFormat F>
constexpr bool streams(int n_tokens) {
  return F != DenseFormat::kF32 && n_tokens <= 2;
}

template <DenseFormat F, int T>
cudaError_t launch_rows(const GemvArgs& a, cudaStream_t stream) {
  const long rows = static_cast<long>(a.n_out) * a.n_groups;
  auto go = [&](auto kernel, int R) {
    const dim3 grid((a.n_out + kWarps * R - 1) / (kWarps * R), a.n_groups);
    return cuda::launch(kernel, grid, dim3(kThreads), 0, stream, a);
  };
  const int s = k_splits(rows, a.n_in);
  auto go_split = [&](auto kernel, int R) {  // a cluster of s blocks along z
    const dim3 grid((a.n_out + kWarps * R - 1) / (kWarps * R), a.n_groups, unsigned(s));
    return cuda::launch_clustered(kernel, grid, dim3(kThreads), 0, stream, dim3(1, 1, unsigned(s)), a);
  };
  // The persistent kernel when the row blocks outnumber the resident blocks (more than one wave).
  auto go_persist_or = [&](auto persist, auto stream_kernel, int R) {
    const long blocks = (a.n_out + kWarps * R - 1) / (kWarps * R);
    const int resident = resident_blocks(persist) * sm_count();
    if (blocks * a.n_groups <= resident) return go(stream_kernel, R);
    const dim3 grid(unsigned(std::max(1, resident / a.n_groups)), a.n_groups);
    return cuda::launch(persist, grid, dim3(kThreads), 0, stream, a);
  };
  if constexpr (streams<F>(T)) {
    // Two blocks per SM at least: a warp's loads are in flight continuously, so enough warps keep enough
    // bytes in flight; within that, as many rows per warp as the split rows allow (x̂ reuse).
    const int R = rows_per_warp(rows * s, 2);
    auto go_rows = [&](auto k1, auto k2, auto k4) { return R == 4 ? go_split(k4, R) : R == 2 ? go_split(k2, R) : go_split(k1, R); };
    if (s == 4) return go_rows(gemv_stream_kernel<F, T, 1, 4>, gemv_stream_kernel<F, T, 2, 4>, gemv_stream_kernel<F, T, 4, 4>);
    if (s == 2) return go_rows(gemv_stream_kernel<F, T, 1, 2>, gemv_stream_kernel<F, T, 2, 2>, gemv_stream_kernel<F, T, 4, 2>);
    if (R == 4) return go_persist_or(gemv_persist_kernel<F, T, 4>, gemv_stream_kernel<F, T, 4, 1>, 4);
    if (R == 2) return go_persist_or(gemv_persist_kernel<F, T, 2>, gemv_stream_kernel<F, T, 2, 1>, 2);
    return go_persist_or(gemv_persist_kernel<F, T, 1>, gemv_stream_kernel<F, T, 1, 1>, 1);
  } else {
    // The staged kernel reads x̂ from shared memory, but a warp's 4 rows share each x̂ read and keep 4
    // chunks in flight: with one row per warp, the k-split shapes ran 1.4–2.3× slower at 4–16 tokens
    // (bench/results/dense_h200.md). Rows per warp 1 or 4 only when split (fewer kernels).
    if (s > 1) {
      const bool four = rows * s >= 4L * kWarps * sm_count();
      if (s == 4) return four ? go_split(gemv_kernel<F, T, 4, 4>, 4) : go_split(gemv_kernel<F, T, 1, 4>, 1);
      return four ? go_split(gemv_kernel<F, T, 4, 2>, 4) : go_split(gemv_kernel<F, T, 1, 2>, 1);
    }
    const int R = rows_per_warp(rows, 1);
    if (R == 4) return go(gemv_kernel<F, T, 4, 1>, 4);
    if (R == 2) return go(gemv_kernel<F, T, 2, 1>, 2);
    return go(gemv_kernel<F, T, 1, 1>, 1);
  }
}

template <DenseFormat F>
cudaError_t launch_tokens(const GemvArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 1) return launch_rows<F, 1>(a, stream);
  if (a.n_tokens <= 2) return launch_rows<F, 2>(a, stream);
  if (a.n_tokens <= 4) return launch_rows<F, 4>(a, stream);
  if (a.n_tokens <= 8) return launch_rows<F, 8>(a, stream);
  return launch_rows<F, 16>(a, stream);
}

}  // namespace

// Blocks of `kernel` one SM holds at once (occupancy), looked up once per kernel.
int resident_blocks(void (*kernel)(GemvArgs)) {
  static std::mutex mu;
  static std::unordered_map<void (*)(GemvArgs), int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(kernel);
  if (it != cache.end()) return it->second;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess || per_sm < 1) per_sm = 1;
  cache.emplace(kernel, per_sm);
  return per_sm;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return count;
  }();
  return n;
}

int gemv_k_splits(long rows, int n_in) { return k_splits(rows, n_in); }

cudaError_t gemv_launch(const GemvArgs& a, cudaStream_t stream) {
  if (a.n_tokens < 1 || a.n_tokens > 16) return cudaErrorInvalidValue;
  switch (a.format) {
    case DenseFormat::kFp8: return launch_tokens<DenseFormat::kFp8>(a, stream);
    case DenseFormat::kFp4: return launch_tokens<DenseFormat::kFp4>(a, stream);
    case DenseFormat::kBf16: return launch_tokens<DenseFormat::kBf16>(a, stream);
    case DenseFormat::kF32: return launch_tokens<DenseFormat::kF32>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace spw::densedev
