// EXL3 small-batch GEMM/GEMV kernels (mma.sync m16n8k16, trellis decoded in registers), two paths
// (Exl3GemmPath): kXSmem (x rotated per block into shared memory, trellis in register batches) and kBulk
// (as kXSmem, trellis by block-wide bulk copies).
// Contract, limits and accuracy: exl3_gemm.h.
// Launch shape: grid (n/128 column groups, k splits), 256 compute threads; warp w of block (gx, gy)
// owns output columns [128·gx + 16·w, +16) over the block's k slice; partial sums meet in slice order
// and the last slice of a column group finishes it (output Hadamard, svh, bias): exl3_bulk.cuh.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/exl3_bulk.cuh"
#include "cuda/exl3_device.cuh"
#include "cuda/exl3_gemm.h"

namespace spw {
namespace {

using namespace exl3dev;

constexpr int kMaxRows = 64;  // rows of x per launch of the bulk path (the workspace holds that many)

// Path kXSmem (the first kernel): each block rotates its k-slice of x into shared memory itself (no
// second launch), then each warp loads its strip's tiles in 8-tile register batches and decodes them.
// Grid (n/128 column groups, k splits of ≤ kMaxKBlocksPerSplit·128), same epilogue as the ring path.
constexpr int kMaxKBlocksPerSplit = 32;  // k slice ≤ 4096 ⇒ ≤ 131 KB of shared memory for 16 rows
template <int K, int CB, bool M16>
__global__ void __launch_bounds__(kThreads) exl3_gemm_xsmem_kernel(
    const uint16_t* __restrict__ trellis, const uint16_t* __restrict__ suh, const uint16_t* __restrict__ svh,
    const uint16_t* __restrict__ bias, const float* __restrict__ x, float* __restrict__ y, float* acc,
    uint32_t* counters, int k, int n, int m, int kpb, bool round_out) {
  constexpr int kRows = M16 ? 16 : 8;
  constexpr int kWords = 8 * K;  // uint32 per tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  half* xs = reinterpret_cast<half*>(smem_raw);
  const int ld = kpb + 8;  // +8 halves: rows land on distinct banks for the A-fragment loads
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int k0 = blockIdx.y * kpb;
  const int klen = min(kpb, k - k0);

  // 1. The block's k slice of x, rotated, in shared memory.
  rotate_slice<kRows>(x, suh, xs, ld, k, k0, klen, m);
  __syncthreads();

  // 2. This warp's 16-column strip over the k slice.
  const int n_tn = n / 16;
  const int tn = blockIdx.x * 8 + warp;
  const uint32_t* tiles = reinterpret_cast<const uint32_t*>(trellis) + (static_cast<size_t>(k0 / 16) * n_tn + tn) * kWords;
  const size_t tile_stride = static_cast<size_t>(n_tn) * kWords;
  const LaneWindow lw = lane_window<K>(lane);
  const int t4 = lane & 3, g = lane >> 2;
  float c[2][4] = {};
  const int n_tiles = klen / 16;  // multiple of 8
#pragma unroll 1
  for (int it = 0; it < n_tiles; it += 8) {
    uint32_t A[8], B[8], C[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const uint32_t* p = tiles + static_cast<size_t>(it + u) * tile_stride;
      A[u] = __ldg(p + lw.wa);
      B[u] = __ldg(p + lw.wb);
      C[u] = __ldg(p + lw.wc);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const half* xr = xs + g * ld + (it + u) * 16 + 2 * t4;
      const uint32_t x0 = *reinterpret_cast<const uint32_t*>(xr);
      const uint32_t x1 = *reinterpret_cast<const uint32_t*>(xr + 8);
      uint32_t x2 = 0, x3 = 0;
      if constexpr (M16) {
        x2 = *reinterpret_cast<const uint32_t*>(xr + 8 * ld);
        x3 = *reinterpret_cast<const uint32_t*>(xr + 8 * ld + 8);
      }
      tile_mma<K, CB, M16>(A[u], B[u], C[u], lw.off, x0, x1, x2, x3, c[0], c[1]);
    }
  }

  // 3. Partial sums into the workspace; the last block of this column group finishes it.
  BulkBlock b;
  b.svh = svh, b.bias = bias, b.y = y, b.acc = acc, b.counter = counters + blockIdx.x;
  b.k = k, b.n = n, b.m = m, b.kpb = kpb, b.group = blockIdx.x, b.split = blockIdx.y, b.n_splits = gridDim.y;
  b.round_out = round_out;
  finish_column_group<M16 ? 2 : 1>(b, c, true, tn);
}


// Path kBulk: like kXSmem, but the trellis reaches shared memory by bulk copies from a producer warp
// (exl3_bulk.cuh: bulk_gemm_block), so loads cost almost no issue slots. Grid as kXSmem; 288 threads.
// G = 8-token groups per launch (1, 2 or 8): every tile is decoded once and multiplied with all 8·G
// rows of x, so a prefill chunk of 64 tokens decodes the tensor once instead of four times.
// x: the fp32 rows, except for G = 8, where it is the fp16 rows exl3_rotate_rows_cuda already rotated
// (one signature for all instances, so pick_kernel serves them all).
template <int K, int CB, int G>
__global__ void __launch_bounds__(kBulkThreads) exl3_gemm_bulk_kernel(
    const uint16_t* __restrict__ trellis, const uint16_t* __restrict__ suh, const uint16_t* __restrict__ svh,
    const uint16_t* __restrict__ bias, const float* __restrict__ x, float* __restrict__ y, float* acc,
    uint32_t* counters, int k, int n, int m, int kpb, bool round_out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  BulkBlock b;
  b.trellis = trellis, b.suh = suh, b.svh = svh, b.bias = bias, b.x = x, b.y = y, b.acc = acc;
  b.counter = counters + blockIdx.x;
  b.k = k, b.n = n, b.m = m, b.kpb = kpb, b.group = blockIdx.x, b.split = blockIdx.y, b.n_splits = gridDim.y;
  b.round_out = round_out;
  bulk_gemm_block<K, CB, G, G == 8>(b, smem_raw);
}

// xr[row][i] = fp16(had128(x[row][i] · suh[i])) for rows < m, one warp per (row, 128-block): the input of
// the 64-row bulk kernel, rotated once instead of once per column group (exl3_rotate_rows_cuda).
__global__ void __launch_bounds__(kThreads) exl3_rotate_rows_kernel(const float* __restrict__ x,
                                                                    const uint16_t* __restrict__ suh,
                                                                    __half* __restrict__ xr, int k, int64_t m) {
  int64_t row;
  int b;
  if (!rotation_job<kThreads>(m, k, row, b)) return;
  rotate_block(x + row * k + b * 128, suh + b * 128, xr + row * k + b * 128, threadIdx.x & 31);
}

using XSmemKernel = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*, const float*, float*,
                             float*, uint32_t*, int, int, int, int, bool);

// The (K, codebook, 16-row) instance of a kernel template; nullptr for K outside 2..6.
template <class Fn, template <int, int, bool> class Pick>
Fn pick_kernel(int K, int cb, bool m16) {
  auto by_cb = [&](auto k_tag) -> Fn {
    constexpr int Kc = decltype(k_tag)::value;
    switch (cb) {
      case 0: return m16 ? Pick<Kc, 0, true>::fn : Pick<Kc, 0, false>::fn;
      case 1: return m16 ? Pick<Kc, 1, true>::fn : Pick<Kc, 1, false>::fn;
      default: return m16 ? Pick<Kc, 2, true>::fn : Pick<Kc, 2, false>::fn;
    }
  };
  switch (K) {
    case 2: return by_cb(std::integral_constant<int, 2>{});
    case 3: return by_cb(std::integral_constant<int, 3>{});
    case 4: return by_cb(std::integral_constant<int, 4>{});
    case 5: return by_cb(std::integral_constant<int, 5>{});
    case 6: return by_cb(std::integral_constant<int, 6>{});
  }
  return nullptr;
}
// The bulk kernel's instances by 8-token groups: m16 = false → G = 1, true → G = 2; BulkPick64: G = 8.
template <int K, int CB, bool M16>
struct BulkPick {
  static constexpr XSmemKernel fn = exl3_gemm_bulk_kernel<K, CB, M16 ? 2 : 1>;
};
template <int K, int CB, bool>
struct BulkPick64 {
  static constexpr XSmemKernel fn = exl3_gemm_bulk_kernel<K, CB, 8>;
};
template <int K, int CB, bool M16>
struct XSmemPick {
  static constexpr XSmemKernel fn = exl3_gemm_xsmem_kernel<K, CB, M16>;
};

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

int sm_count() {
  static int n_sms = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  return n_sms;
}

}  // namespace

bool exl3_cuda_supports(const Exl3CudaTensor& t) {
  return !t.bits.half() && t.bits.ka() >= 2 && t.bits.ka() <= 6 && t.k > 0 && t.n > 0 && t.k % 128 == 0 &&
         t.n % 128 == 0 && t.trellis && t.suh && t.svh;
}

namespace {
size_t acc_nbytes(int64_t max_n) { return sizeof(float) * kMaxRows * max_n; }
size_t counters_nbytes(int64_t max_n) { return sizeof(uint32_t) * (max_n / 128 + 1); }
size_t xr_nbytes(int64_t max_k) { return sizeof(__half) * kMaxRows * max_k; }
}  // namespace

size_t exl3_cuda_workspace_nbytes(int64_t max_k, int64_t max_n) {
  return acc_nbytes(max_n) + counters_nbytes(max_n) + xr_nbytes(max_k);
}

Status exl3_cuda_workspace_alloc(Exl3CudaWorkspace& ws, int64_t max_k, int64_t max_n) {
  const size_t acc_bytes = acc_nbytes(max_n), cnt_bytes = counters_nbytes(max_n);
  if (cudaError_t e = cudaMalloc(&ws.acc, acc_bytes); e != cudaSuccess) return cuda_error("malloc workspace", e);
  if (cudaError_t e = cudaMalloc(&ws.counters, cnt_bytes); e != cudaSuccess) return cuda_error("malloc workspace", e);
  if (cudaError_t e = cudaMemset(ws.acc, 0, acc_bytes); e != cudaSuccess) return cuda_error("memset workspace", e);
  if (cudaError_t e = cudaMemset(ws.counters, 0, cnt_bytes); e != cudaSuccess) return cuda_error("memset workspace", e);
  if (cudaError_t e = cudaMalloc(&ws.xr, xr_nbytes(max_k)); e != cudaSuccess)
    return cuda_error("malloc workspace", e);
  ws.capacity_k = max_k;
  ws.capacity_n = max_n;
  return {};
}

void exl3_cuda_workspace_free(Exl3CudaWorkspace& ws) {
  cudaFree(ws.acc);
  cudaFree(ws.counters);
  cudaFree(ws.xr);
  ws = {};
}

namespace {

Status set_smem(const void* fn, size_t smem) {
  if (smem <= 40 * 1024) return {};  // dynamic + static above 48 KB needs the opt-in
  if (cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      e != cudaSuccess)
    return cuda_error("set shared memory", e);
  return {};
}

// Path kXSmem: one launch per 16 rows; blocks rotate x themselves (exl3_gemm_xsmem_kernel).
Status gemm_xsmem(const Exl3CudaTensor& t, const float* x, int64_t m, float* y, Exl3CudaWorkspace& ws, cudaStream_t s,
                  bool round_out) {
  const int64_t n_groups = t.n / 128, k_blocks = t.k / 128;
  const int64_t want = (ws.blocks_per_sm > 0 ? ws.blocks_per_sm : 4) * sm_count();
  int64_t splits = std::min<int64_t>(k_blocks, std::max<int64_t>(1, (want + n_groups - 1) / n_groups));
  int64_t per = std::min<int64_t>(kMaxKBlocksPerSplit, (k_blocks + splits - 1) / splits);
  splits = (k_blocks + per - 1) / per;
  const int kpb = static_cast<int>(per * 128);
  for (int64_t c = 0; c < m; c += 16) {
    const int mc = static_cast<int>(std::min<int64_t>(16, m - c));
    const bool m16 = mc > 8;
    XSmemKernel fn = pick_kernel<XSmemKernel, XSmemPick>(t.bits.ka(), static_cast<int>(t.codebook), m16);
    const size_t smem = sizeof(__half) * (m16 ? 16 : 8) * (kpb + 8);
    if (Status st = set_smem(reinterpret_cast<const void*>(fn), smem); !st.ok()) return st;
    fn<<<dim3(static_cast<unsigned>(n_groups), static_cast<unsigned>(splits)), kThreads, smem, s>>>(
        t.trellis, t.suh, t.svh, t.bias, x + c * t.k, y + c * t.n, ws.acc, ws.counters, static_cast<int>(t.k),
        static_cast<int>(t.n), mc, kpb, round_out);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch exl3_gemm_xsmem_kernel", e);
  }
  return {};
}

// Path kBulk: as kXSmem, with the bulk-copy ring (exl3_gemm_bulk_kernel); up to 64 rows per launch.
Status gemm_bulk(const Exl3CudaTensor& t, const float* x, int64_t m, float* y, Exl3CudaWorkspace& ws, cudaStream_t s,
                 bool round_out) {
  const int64_t n_groups = t.n / 128, k_blocks = t.k / 128;
  const int K = t.bits.ka();
  const int64_t rows_per_launch = ws.rows_per_launch == 16 ? 16 : kMaxRows;
  for (int64_t c = 0; c < m; c += rows_per_launch) {
    const int mc = static_cast<int>(std::min<int64_t>(rows_per_launch, m - c));
    const int G = mc > 16 ? 8 : mc > 8 ? 2 : 1;
    // 64 rows of x take 66 KB of shared memory per 512 k: slices of ≤ 1024 k (≤ 181 KB with the ring),
    // about two blocks per SM by default.
    const int64_t max_per = G == 8 ? 8 : kMaxKBlocksPerSplit;
    const int64_t want = (ws.blocks_per_sm > 0 ? ws.blocks_per_sm : G == 8 ? 2 : 4) * sm_count();
    int64_t splits = std::min<int64_t>(k_blocks, std::max<int64_t>(1, (want + n_groups - 1) / n_groups));
    int64_t per = std::min<int64_t>(max_per, (k_blocks + splits - 1) / splits);
    splits = (k_blocks + per - 1) / per;
    const int kpb = static_cast<int>(per * 128);
    XSmemKernel fn = G == 8 ? pick_kernel<XSmemKernel, BulkPick64>(K, static_cast<int>(t.codebook), false)
                            : pick_kernel<XSmemKernel, BulkPick>(K, static_cast<int>(t.codebook), G == 2);
    const size_t smem = static_cast<size_t>(bulk_ring_bytes(K)) + sizeof(__half) * 8 * G * (kpb + 8);
    if (Status st = set_smem(reinterpret_cast<const void*>(fn), smem); !st.ok()) return st;
    const float* xin = x + c * t.k;
    if (G == 8) {  // the 64-row kernel reads x rotated once
      if (Status st = exl3_rotate_rows_cuda(xin, t.suh, ws.xr, t.k, mc, s); !st.ok()) return st;
      xin = reinterpret_cast<const float*>(ws.xr);
    }
    fn<<<dim3(static_cast<unsigned>(n_groups), static_cast<unsigned>(splits)), kBulkThreads, smem, s>>>(
        t.trellis, t.suh, t.svh, t.bias, xin, y + c * t.n, ws.acc, ws.counters, static_cast<int>(t.k),
        static_cast<int>(t.n), mc, kpb, round_out);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch exl3_gemm_bulk_kernel", e);
  }
  return {};
}

}  // namespace

Status exl3_rotate_rows_cuda(const float* x, const uint16_t* suh, void* xr, int64_t k, int64_t m, void* stream) {
  const int64_t jobs = m * (k / 128), per_block = kThreads / 32;
  exl3_rotate_rows_kernel<<<static_cast<unsigned>((jobs + per_block - 1) / per_block), kThreads, 0,
                            static_cast<cudaStream_t>(stream)>>>(x, suh, static_cast<__half*>(xr), static_cast<int>(k), m);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch exl3_rotate_rows_kernel", e);
  return {};
}

const char* exl3_gemm_path_name(Exl3GemmPath p) {
  switch (p) {
    case Exl3GemmPath::kAuto: return "auto";
    case Exl3GemmPath::kXSmem: return "xsmem";
    case Exl3GemmPath::kBulk: return "bulk";
  }
  return "?";
}

Status exl3_gemm_cuda(const Exl3CudaTensor& t, const float* x, int64_t m, float* y, Exl3CudaWorkspace& ws, void* stream,
                      Exl3GemmPath path, bool round_out_bf16) {
  if (!exl3_cuda_supports(t))
    return make_error("exl3_gemm_cuda: unsupported tensor (K=", t.bits.k_x2 / 2.0, " ", exl3_codebook_name(t.codebook),
                      " k=", t.k, " n=", t.n, "); supported: integer K 2..6, k and n multiples of 128");
  if (ws.capacity_n < t.n || ws.capacity_k < t.k)
    return make_error("exl3_gemm_cuda: workspace holds k=", ws.capacity_k, " n=", ws.capacity_n, ", tensor has k=", t.k,
                      " n=", t.n);
  if (m < 1) return make_error("exl3_gemm_cuda: m=", m);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // kAuto = kBulk: the faster of the two in the last H200 measurement (bench/results/exl3_h200.md).
  return path == Exl3GemmPath::kXSmem ? gemm_xsmem(t, x, m, y, ws, s, round_out_bf16)
                                      : gemm_bulk(t, x, m, y, ws, s, round_out_bf16);
}

}  // namespace spw
