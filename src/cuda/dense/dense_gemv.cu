// Decode path of the dense linears (dense_linear.h, LinearPath::kGemv): y = x̂·Wᵀ for n_tokens ≤ 16,
// streaming the compact weight once.
//
// Launch shape: grid (ceil(n_out / (8·R)), n_groups), 256 threads = 8 warps; warp w of block b owns
// rows [(8b + w)·R, +R). The k axis is walked in 512-wide tiles: the block stages x̂[0..T)[tile] in
// shared memory (rows padded 4 floats per 16, so the 16-float chunks of consecutive lanes fall on
// distinct banks), then lane l dequantizes elements [16l, 16l+16) of each of its R rows into registers
// (one 16-byte fp8 load, 8-byte fp4, 32-byte bf16, 64-byte f32 per row: coalesced across the warp)
// and accumulates T·R dot products in fp32. A warp butterfly sums the lanes at the end.
// T (tokens, templated 1/2/4/8/16, rows ≥ n_tokens masked to zero) and R (1/2/4) are chosen by the
// launcher: R = 4 when that still gives ≥ 1 block per SM, fewer rows per warp on narrow weights.
// Accuracy: exact products (x̂, W bf16-representable), fp32 sums in lane-then-butterfly order.
// Tests: tests/gpu/test_cuda_dense.cpp. Benchmark: bench/dense/bench_dense.cpp.
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

template <DenseFormat F, int T, int R>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
  constexpr int U = tiles_per_round<T, R>();
  __shared__ __align__(16) float xs[T][U * kTilePad];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = blockIdx.y;
  const void* w = static_cast<const uint8_t*>(a.w) + g * a.w_group_nbytes;
  const float* x = a.x + static_cast<size_t>(g) * a.x_group_off;
  float* y = a.y + static_cast<size_t>(g) * a.y_group_off;
  const int row0 = (blockIdx.x * kWarps + warp) * R;

  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;

  // A round covers U tiles of 512: issue every weight load of the round, stage x for all of them while
  // those loads are in flight (the weights do not wait for x), then accumulate tile by tile — the same
  // per-lane order as one tile per round.
  for (int k0 = 0; k0 < a.n_in; k0 += U * kTileK) {
    Chunk<F> chunks[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + u * kTileK + 16 * lane;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        chunks[u][r] = Chunk<F>{};
        if (k < a.n_in && row0 + r < a.n_out) chunks[u][r] = load_chunk<F>(w, a.scale, row0 + r, k, a.n_in, a.weight_block);
      }
    }

    __syncthreads();  // the previous round's x is consumed
    for (int i = threadIdx.x; i < T * U * (kTileK / 4); i += kThreads) {
      const int t = i / (U * kTileK / 4), c = (i % (U * kTileK / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t < a.n_tokens && k0 + c < a.n_in) v = *reinterpret_cast<const float4*>(x + static_cast<size_t>(t) * a.ldx + k0 + c);
      *reinterpret_cast<float4*>(&xs[t][c + (c / 16) * 4]) = v;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + u * kTileK + 16 * lane;
      if (k >= a.n_in) break;  // later tiles of the round are past the end too
      float wv[R][16];
#pragma unroll
      for (int r = 0; r < R; ++r) dequant_chunk<F>(chunks[u][r], wv[r]);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float xv[16];
        const float4* xp = reinterpret_cast<const float4*>(&xs[t][u * kTilePad + 20 * lane]);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float4 v = xp[q];
          xv[4 * q] = v.x, xv[4 * q + 1] = v.y, xv[4 * q + 2] = v.z, xv[4 * q + 3] = v.w;
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < 16; ++j) acc[r][t] = fmaf(wv[r][j], xv[j], acc[r][t]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], off);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row0 + r >= a.n_out) break;
#pragma unroll
    for (int t = 0; t < T; ++t)
      if (t < a.n_tokens) y[static_cast<size_t>(t) * a.ldy + row0 + r] = a.round_out ? round_bf16_dev(acc[r][t]) : acc[r][t];
  }
}

template <DenseFormat F, int T>
cudaError_t launch_rows(const GemvArgs& a, int rows_per_warp, cudaStream_t stream) {
  auto go = [&](auto kernel, int R) {
    const dim3 grid((a.n_out + kWarps * R - 1) / (kWarps * R), a.n_groups);
    kernel<<<grid, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
  };
  if (rows_per_warp == 4) return go(gemv_kernel<F, T, 4>, 4);
  if (rows_per_warp == 2) return go(gemv_kernel<F, T, 2>, 2);
  return go(gemv_kernel<F, T, 1>, 1);
}

template <DenseFormat F>
cudaError_t launch_tokens(const GemvArgs& a, int rows_per_warp, cudaStream_t stream) {
  if (a.n_tokens <= 1) return launch_rows<F, 1>(a, rows_per_warp, stream);
  if (a.n_tokens <= 2) return launch_rows<F, 2>(a, rows_per_warp, stream);
  if (a.n_tokens <= 4) return launch_rows<F, 4>(a, rows_per_warp, stream);
  if (a.n_tokens <= 8) return launch_rows<F, 8>(a, rows_per_warp, stream);
  return launch_rows<F, 16>(a, rows_per_warp, stream);
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

}  // namespace

cudaError_t gemv_launch(const GemvArgs& a, cudaStream_t stream) {
  if (a.n_tokens < 1 || a.n_tokens > 16) return cudaErrorInvalidValue;
  const long rows = static_cast<long>(a.n_out) * a.n_groups;
  const int rows_per_warp = rows >= 4L * kWarps * sm_count() ? 4 : rows >= 2L * kWarps * sm_count() ? 2 : 1;
  switch (a.format) {
    case DenseFormat::kFp8: return launch_tokens<DenseFormat::kFp8>(a, rows_per_warp, stream);
    case DenseFormat::kFp4: return launch_tokens<DenseFormat::kFp4>(a, rows_per_warp, stream);
    case DenseFormat::kBf16: return launch_tokens<DenseFormat::kBf16>(a, rows_per_warp, stream);
    case DenseFormat::kF32: return launch_tokens<DenseFormat::kF32>(a, rows_per_warp, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace spw::densedev
