// mHC kernels (contract in hyper_connection.h).
//   hc_mixes: grid (token, group of G outputs, slice): a cluster of kMixesSplit blocks per (token, group)
//     strides over the token's hc·d inputs, a slice per block, summing X² in f64 and the G dot products
//     in f32; blocks reduce, then block 0 of the cluster adds the slices in rank order (distributed
//     shared memory). G = 2 for decode-sized calls, 8 for long chunks, whose blocks walk 8 tokens each
//     with the weights in registers (hc_mixes_rows_kernel, same order). The first version (a warp per
//     output, 3 blocks per decode token) took 135 µs per call on the H200; the second (one 1024-thread
//     block per group) 12 µs.
//   hc_split_sinkhorn: one warp per token; the hc × hc matrix in shared memory; lane j does row j's
//     softmax, then every lane owns matrix elements and computes its row / column sum with the
//     reference's loop (same additions in the same order), so the results equal the reference's
//     one-thread loops; the first version (one thread per token) took 55 µs per decode call.
//     hc = 2 and 4 (the models' value) keep the matrix in registers, a lane per element, and gather
//     sums by shuffles (hc_split_sinkhorn_small_kernel): the same operations, fewer round trips.
//   hc_head_pre: one thread per (token, stream).
//   hc_collapse / hc_expand: one thread per (token, channel), all hc streams of that channel.
#include <cooperative_groups.h>

#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/hc_device.cuh"
#include "cuda/ops/hyper_connection.h"
#include "cuda/launch.h"

namespace spw::cuda {
namespace {

constexpr int kThreads = 256;
// hc_mixes: a cluster of kMixesSplit blocks per (token, group of G outputs), each block one slice of the
// hc·d inputs; the partial sums meet in block 0 of the cluster through distributed shared memory, in rank
// order. A decode token's 24 outputs so pull fn from 96 SMs (12 clusters × 8), where the previous version's
// 12 blocks of 1024 threads (one per group, the whole row each) took 12 µs per decode call (a kernel trace)
// for 2 MB. The same split, block size and reduction order for every token count keep the result independent
// of the batch.
constexpr int kMixesThreads = 256;
constexpr int kMixesSplit = 8;

// The block's G dot products: each warp's partials by shuffles, then thread g < G adds the warps' sums in
// warp order into out[g]. Both hc_mixes kernels reduce through this, so their orders are the same.
template <int G>
__device__ __forceinline__ void block_dot_sums(const float (&acc)[G], float (&red)[G][kMixesThreads / 32], float* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float v = acc[g];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) red[g][warp] = v;
  }
  __syncthreads();
  if (threadIdx.x < G) {
    float v = 0.f;
    for (int w = 0; w < n_warps; ++w) v += red[threadIdx.x][w];
    out[threadIdx.x] = v;
  }
}

template <int G>
__global__ void __cluster_dims__(1, 1, kMixesSplit) __launch_bounds__(kMixesThreads)
    hc_mixes_kernel(const float* x_streams, const float* fn, int n_out, int64_t hc_d, float norm_eps, float* mixes) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  {  // this block's slice of its G rows of fn (a weight) into L2 while the streams are still being written
    const int64_t slice = (hc_d + kMixesSplit - 1) / kMixesSplit, lo = int64_t(cluster.block_rank()) * slice;
    const int64_t n = lo + slice < hc_d ? slice : hc_d - lo;
    if (blockIdx.x == 0 && n > 0)
      for (int g = 0; g < G && int(blockIdx.y) * G + g < n_out; ++g)
        prefetch_l2(fn + (int64_t(blockIdx.y) * G + g) * hc_d + lo, size_t(n) * sizeof(float));
  }
  pdl_enter();
  __shared__ double scratch[32];
  __shared__ float red[G][kMixesThreads / 32];
  __shared__ double part_ss;    // this block's Σ X² over its slice
  __shared__ float part_acc[G]; // ... and its G dot products
  const float* x = x_streams + int64_t(blockIdx.x) * hc_d;
  const int o0 = int(blockIdx.y) * G;
  const unsigned rank = cluster.block_rank();
  const int64_t slice = (hc_d + kMixesSplit - 1) / kMixesSplit;
  const int64_t lo = int64_t(rank) * slice, hi = lo + slice < hc_d ? lo + slice : hc_d;
  double ss = 0.0;
  float acc[G];
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g] = 0.f;
#pragma unroll 4
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float xv = x[i];
    ss += double(xv) * xv;
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (o0 + g < n_out) acc[g] += fn[int64_t(o0 + g) * hc_d + i] * xv;
  }
  ss = dev::block_sum(ss, scratch);
  block_dot_sums<G>(acc, red, part_acc);
  if (threadIdx.x == 0) part_ss = ss;
  cluster.sync();  // every block's partials are written
  if (rank == 0 && threadIdx.x < G && o0 + int(threadIdx.x) < n_out) {
    double ss_all = 0.0;
    float v = 0.f;
    for (unsigned r = 0; r < kMixesSplit; ++r) {
      ss_all += *cluster.map_shared_rank(&part_ss, r);
      v += cluster.map_shared_rank(part_acc, r)[threadIdx.x];
    }
    const float inv = 1.0f / sqrtf(float(ss_all / double(hc_d)) + norm_eps);
    mixes[int64_t(blockIdx.x) * n_out + o0 + threadIdx.x] = v * inv;
  }
  cluster.sync();  // block 0 has read the others' shared memory before they exit
}

// hc_mixes for long chunks: the same cluster split as hc_mixes_kernel, but a block takes kMixesRows tokens with
// its slice of the G weight rows in shared memory (each thread keeps to its own column of it, so no barrier).
// Every token's products, additions and reductions are those of hc_mixes_kernel, in the same order — each
// thread's f32/f64 partials in input order, the warp butterflies, the warps in order (block_dot_sums; the f64
// sum as dev::block_sum), the slices in rank order — so the results are bit-identical
// (CudaOpsHc.MixesIndependentOfTokenCount). What differs is the schedule: the loads of kMixesRowBatch tokens are
// in flight together and their butterflies interleave, and the cross-warp sums wait until all the block's tokens
// are done. The previous form (weights in registers, 8 tokens per block, a block-wide reduction with two barriers
// after each token) took 1.97 ms per 4096-token V4.1 call on the H200 (a kernel trace): each token's loads
// waited for the previous token's reduction, at two blocks per SM.
constexpr int kMixesRows = 32;      // tokens per block
constexpr int kMixesRowBatch = 4;   // tokens whose loads and sums are in flight together
constexpr int kMixesMaxIter = 10;   // slice ≤ 10 · kMixesThreads inputs (hc·d ≤ 20480, V4.1 at hc 4)
constexpr int kMixesWarps = kMixesThreads / 32;
static_assert(kMixesRows % kMixesRowBatch == 0 && kMixesRows % kMixesWarps == 0, "whole batches, whole tokens per warp");

// Sums v[k] over the warp's lanes for every k < N (N a power of two ≤ 32) in the tree of a xor butterfly (lanes
// paired at distance 16, then 8, 4, 2, 1; each addition's operands are the same, so the bits are those of
// v[k]'s own butterfly), but scattered: lane l returns the sum for k = l >> (5 − log2 N). While more than one
// value is left, each step keeps half of them and sends the other half to the partner lane (31 shuffles for 32
// sums, where 32 butterflies take 160); then plain butterfly steps. Used by hc_mixes_rows_kernel.
template <int N, typename T>
__device__ __forceinline__ T warp_sum_scatter(T (&v)[N], int lane) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N a power of two up to 32");
  constexpr int kSteps = N >= 32 ? 5 : N >= 16 ? 4 : N >= 8 ? 3 : N >= 4 ? 2 : N >= 2 ? 1 : 0;
#pragma unroll
  for (int st = 0; st < kSteps; ++st) {
    const int n = N >> st, dist = 16 >> st;
    const bool upper = lane & dist;  // this lane keeps the upper half of the values left
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      if (k >= n / 2) break;
      const T send = upper ? v[k] : v[k + n / 2];
      const T keep = upper ? v[k + n / 2] : v[k];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, send, dist);
    }
  }
  T r = v[0];
#pragma unroll
  for (int st = kSteps; st < 5; ++st) r += __shfl_xor_sync(0xffffffffu, r, 16 >> st);
  return r;
}

template <int G>
constexpr size_t mixes_rows_smem() {
  return sizeof(float) * kMixesMaxIter * G * kMixesThreads;
}

template <int G>
__global__ void __cluster_dims__(1, 1, kMixesSplit) __launch_bounds__(kMixesThreads, 2)
    hc_mixes_rows_kernel(const float* x_streams, const float* fn, int64_t n_tokens, int n_out, int64_t hc_d,
                         float norm_eps, float* mixes) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ float w_s[];  // [kMixesMaxIter][G][kMixesThreads]: thread t's weights in column t
  __shared__ float red[kMixesRows][G][kMixesWarps];
  __shared__ double ss_red[kMixesRows][kMixesWarps];
  __shared__ double part_ss[kMixesRows];
  __shared__ float part_acc[kMixesRows][G];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int o0 = int(blockIdx.y) * G;
  const unsigned rank = cluster.block_rank();
  const int64_t slice = (hc_d + kMixesSplit - 1) / kMixesSplit;
  const int64_t lo = int64_t(rank) * slice, hi = lo + slice < hc_d ? lo + slice : hc_d;
#pragma unroll
  for (int it = 0; it < kMixesMaxIter; ++it) {
    const int64_t i = lo + tid + int64_t(it) * kMixesThreads;
#pragma unroll
    for (int g = 0; g < G; ++g)
      w_s[(it * G + g) * kMixesThreads + tid] = i < hi && o0 + g < n_out ? fn[int64_t(o0 + g) * hc_d + i] : 0.f;
  }
  pdl_enter();  // fn is a weight, read before the wait; the streams come from the previous kernel
  const int64_t t0 = int64_t(blockIdx.x) * kMixesRows;
  for (int r0 = 0; r0 < kMixesRows; r0 += kMixesRowBatch) {
    float xv[kMixesRowBatch][kMixesMaxIter];
#pragma unroll
    for (int b = 0; b < kMixesRowBatch; ++b) {
      const int64_t t = t0 + r0 + b < n_tokens ? t0 + r0 + b : n_tokens - 1;  // past the end: a real row, unused
#pragma unroll
      for (int it = 0; it < kMixesMaxIter; ++it) {
        const int64_t i = lo + tid + int64_t(it) * kMixesThreads;
        xv[b][it] = i < hi ? x_streams[t * hc_d + i] : 0.f;
      }
    }
    double ss[kMixesRowBatch];
    float acc[kMixesRowBatch][G];
#pragma unroll
    for (int b = 0; b < kMixesRowBatch; ++b) {
      ss[b] = 0.0;
#pragma unroll
      for (int g = 0; g < G; ++g) acc[b][g] = 0.f;
    }
#pragma unroll
    for (int it = 0; it < kMixesMaxIter; ++it) {
      if (lo + tid + int64_t(it) * kMixesThreads >= hi) break;
#pragma unroll
      for (int b = 0; b < kMixesRowBatch; ++b) {
        const float x = xv[b][it];
        ss[b] += double(x) * x;
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (o0 + g < n_out) acc[b][g] += w_s[(it * G + g) * kMixesThreads + tid] * x;
      }
    }
    // The warp sums of the batch's kMixesRowBatch·G dot products and kMixesRowBatch sums of squares, in the
    // butterflies' tree but scattered over the lanes (warp_sum_scatter): lane l gets product l.
    static_assert(kMixesRowBatch * G == 32, "one product per lane");
    float flat[kMixesRowBatch * G];
#pragma unroll
    for (int b = 0; b < kMixesRowBatch; ++b)
#pragma unroll
      for (int g = 0; g < G; ++g) flat[b * G + g] = acc[b][g];
    red[r0 + lane / G][lane % G][warp] = warp_sum_scatter(flat, lane);
    constexpr int kLanesPerSs = 32 / kMixesRowBatch;
    const double ss_sum = warp_sum_scatter(ss, lane);
    if (lane % kLanesPerSs == 0) ss_red[r0 + lane / kLanesPerSs][warp] = ss_sum;
  }
  __syncthreads();
  // The block's sums, as block_dot_sums (warps in order from 0) and dev::block_sum (a butterfly over the warps'
  // sums, zeros in the other lanes) add them.
  if (tid < kMixesRows * G) {
    const int r = tid / G, g = tid % G;
    float v = 0.f;
    for (int w = 0; w < kMixesWarps; ++w) v += red[r][g][w];
    part_acc[r][g] = v;
  }
#pragma unroll
  for (int r = warp; r < kMixesRows; r += kMixesWarps) {
    const double v = dev::warp_sum(lane < kMixesWarps ? ss_red[r][lane] : 0.0);
    if (lane == 0) part_ss[r] = v;
  }
  cluster.sync();  // every block's partials are written
  if (rank == 0 && tid < G * kMixesRows) {
    const int r = tid / G, g = tid % G;
    if (t0 + r < n_tokens && o0 + g < n_out) {
      double ss_all = 0.0;
      float v = 0.f;
      for (unsigned q = 0; q < kMixesSplit; ++q) {
        ss_all += cluster.map_shared_rank(part_ss, q)[r];
        v += cluster.map_shared_rank(&part_acc[0][0], q)[r * G + g];
      }
      const float inv = 1.0f / sqrtf(float(ss_all / double(hc_d)) + norm_eps);
      mixes[(t0 + r) * n_out + o0 + g] = v * inv;
    }
  }
  cluster.sync();  // block 0 has read the others' shared memory before they exit
}

using hcdev::mul_add;

constexpr int kSinkhornWarps = 4;  // tokens per block
constexpr int kHcElemsPerLane = (kHcMax * kHcMax + 31) / 32;

// One Sinkhorn normalisation of the warp's hc × hc matrix m (shared memory): every row (rows) or column
// divided by (its sum + eps). Lane owns elements e = lane + 32·r; each sum is the reference's loop over
// the matrix before this normalisation (all sums are taken before any division).
__device__ void sinkhorn_normalize(float* m, int hc, float eps, int lane, bool rows) {
  const int nn = hc * hc;
  float s[kHcElemsPerLane];
#pragma unroll
  for (int r = 0; r < kHcElemsPerLane; ++r) {
    const int e = lane + 32 * r, j = e / hc, k = e % hc;
    s[r] = 0.f;
    if (e < nn) {
      if (rows)
        for (int kk = 0; kk < hc; ++kk) s[r] += m[j * hc + kk];
      else
        for (int jj = 0; jj < hc; ++jj) s[r] += m[jj * hc + k];
    }
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < kHcElemsPerLane; ++r) {
    const int e = lane + 32 * r;
    if (e < nn) m[e] /= (s[r] + eps);
  }
  __syncwarp();
}

__global__ void __launch_bounds__(32 * kSinkhornWarps)
    hc_split_sinkhorn_kernel(const float* mixes_all, const float* scale, const float* base, int64_t n_tokens, int hc,
                             int sinkhorn_iters, float hc_eps, float* pre, float* post, float* comb) {
  pdl_enter();
  __shared__ float matrices[kSinkhornWarps][kHcMax * kHcMax];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = int64_t(blockIdx.x) * kSinkhornWarps + warp;
  if (t >= n_tokens) return;  // the whole warp; only __syncwarp below
  const float* mixes = mixes_all + t * (2 + hc) * hc;
  float* m = matrices[warp];
  const int nn = hc * hc;
  if (lane < hc) {
    const int j = lane;
    pre[t * hc + j] = __fadd_rn(dev::sigmoid(mul_add(mixes[j], scale[0], base[j])), hc_eps);
    post[t * hc + j] = 2.0f * dev::sigmoid(mul_add(mixes[hc + j], scale[1], base[hc + j]));
    // Softmax over k of row j, the reference's loops.
    float mx = -INFINITY;
    for (int k = 0; k < hc; ++k) {
      m[j * hc + k] = mul_add(mixes[2 * hc + j * hc + k], scale[2], base[2 * hc + j * hc + k]);
      mx = fmaxf(mx, m[j * hc + k]);
    }
    float sum = 0.f;
    for (int k = 0; k < hc; ++k) sum += (m[j * hc + k] = dev::exp_f32(m[j * hc + k] - mx));
    for (int k = 0; k < hc; ++k) m[j * hc + k] = m[j * hc + k] / sum + hc_eps;
  }
  __syncwarp();
  for (int it = 0; it < sinkhorn_iters; ++it) {
    if (it > 0) sinkhorn_normalize(m, hc, hc_eps, lane, /*rows=*/true);  // the first pass normalises columns only
    sinkhorn_normalize(m, hc, hc_eps, lane, /*rows=*/false);
  }
  for (int e = lane; e < nn; e += 32) comb[t * nn + e] = m[e];
}

// The same computation for small hc (hc² ≤ 32: V4 and V4.1 have hc = 4) with the matrix in registers
// (hc_device.cuh: split_sinkhorn_warp): the same operations as hc_split_sinkhorn_kernel. The shared-memory
// version spends most of its time on dependent shared-memory round trips (16 µs per decode call on the H200,
// a kernel trace, for 40 normalisations of a 4 × 4 matrix).
template <int HC>
__global__ void __launch_bounds__(32 * kSinkhornWarps)
    hc_split_sinkhorn_small_kernel(const float* mixes_all, const float* scale, const float* base, int64_t n_tokens,
                                   int sinkhorn_iters, float hc_eps, float* pre, float* post, float* comb) {
  pdl_enter();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = int64_t(blockIdx.x) * kSinkhornWarps + warp;
  if (t >= n_tokens) return;  // the whole warp
  float p, q, c;
  hcdev::split_sinkhorn_warp<HC>(mixes_all + t * (2 + HC) * HC, scale, base, sinkhorn_iters, hc_eps, lane, p, q, c);
  if (lane < HC) pre[t * HC + lane] = p, post[t * HC + lane] = q;
  if (lane < HC * HC) comb[t * HC * HC + lane] = c;
}

__global__ void hc_head_pre_kernel(const float* mixes, const float* scale, const float* base, int64_t n_tokens,
                                   int hc, float hc_eps, float* pre) {
  pdl_enter();
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_tokens * hc) return;
  pre[job] = __fadd_rn(dev::sigmoid(mul_add(mixes[job], scale[0], base[job % hc])), hc_eps);
}

__global__ void hc_collapse_kernel(const float* x_streams, const float* pre, int64_t n_tokens, int hc, int64_t d,
                                   bool round_out, float* y) {
  pdl_enter();
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_tokens * d) return;
  const int64_t t = job / d, i = job % d;
  const float* x = x_streams + t * hc * d + i;
  float acc = 0.f;
  for (int j = 0; j < hc; ++j) acc = mul_add(pre[t * hc + j], x[j * d], acc);
  y[job] = round_out ? dev::round_bf16(acc) : acc;
}

__global__ void hc_expand_kernel(float* x_streams, const float* y, const float* post, const float* comb,
                                 int64_t n_tokens, int hc, int64_t d, bool round_out) {
  pdl_enter();
  const int64_t job = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job >= n_tokens * d) return;
  const int64_t t = job / d, i = job % d;
  float* x = x_streams + t * hc * d + i;
  const float* c = comb + t * hc * hc;
  // in[] is indexed by unrolled constants only, so it stays in registers (a runtime index puts it in local memory).
  float in[kHcMax];
#pragma unroll
  for (int j = 0; j < kHcMax; ++j) in[j] = j < hc ? x[j * d] : 0.f;
  for (int k = 0; k < hc; ++k) {
    // Mix first, then add the sublayer output: the reference's order of f32 additions.
    float mixed = 0.f;
#pragma unroll
    for (int j = 0; j < kHcMax; ++j)
      if (j < hc) mixed = mul_add(c[j * hc + k], in[j], mixed);
    const float v = mul_add(post[t * hc + k], y[job], mixed);
    x[k * d] = round_out ? dev::round_bf16(v) : v;
  }
}

Status check_hc(const char* op, int hc) {
  if (hc <= 0 || hc > kHcMax) return make_error(op, ": hc ", hc, " outside 1..", kHcMax);
  return {};
}

}  // namespace

Status hc_mixes(const float* x_streams, const float* fn, int64_t n_tokens, int n_out, int64_t hc_d, float norm_eps,
                float* mixes, cudaStream_t stream) {
  if (hc_d <= 0 || n_out <= 0) return make_error("hc_mixes: hc_d ", hc_d, " and n_out ", n_out, " must be positive");
  if (n_tokens <= 0) return {};
  if (n_tokens > INT32_MAX || n_out > 65535 * 2)
    return make_error("hc_mixes: ", n_tokens, " tokens, ", n_out, " outputs exceed the grid");
  // G outputs per cluster: 2 for decode-sized calls (more SMs per token), 8 for long chunks (X is re-read from
  // L2 n_out/G times per token). G does not change any output's summation order.
  if (n_tokens <= 16) {
    constexpr int G = 2;
    launch(hc_mixes_kernel<G>, dim3(unsigned(n_tokens), unsigned((n_out + G - 1) / G), kMixesSplit), kMixesThreads, 0, stream, x_streams, fn, n_out, hc_d, norm_eps, mixes);
  } else if ((hc_d + kMixesSplit - 1) / kMixesSplit <= int64_t(kMixesMaxIter) * kMixesThreads) {
    constexpr int G = 8;
    constexpr size_t smem = mixes_rows_smem<G>();
    // Per call, not once per process: the opt-in belongs to the current device (prefill-sized calls only).
    if (cudaError_t e = cudaFuncSetAttribute(hc_mixes_rows_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        e != cudaSuccess)
      return make_error("hc_mixes: shared memory opt-in: ", cudaGetErrorString(e));
    launch(hc_mixes_rows_kernel<G>, dim3(unsigned((n_tokens + kMixesRows - 1) / kMixesRows), unsigned((n_out + G - 1) / G), kMixesSplit),
           kMixesThreads, smem, stream, x_streams, fn, n_tokens, n_out, hc_d, norm_eps, mixes);
  } else {
    constexpr int G = 8;
    launch(hc_mixes_kernel<G>, dim3(unsigned(n_tokens), unsigned((n_out + G - 1) / G), kMixesSplit), kMixesThreads, 0, stream, x_streams, fn, n_out, hc_d, norm_eps, mixes);
  }
  return launch_status("hc_mixes_kernel");
}

Status hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int64_t n_tokens, int hc,
                         int sinkhorn_iters, float hc_eps, float* pre, float* post, float* comb, cudaStream_t stream) {
  SPW_TRY(check_hc("hc_split_sinkhorn", hc));
  if (sinkhorn_iters < 1) return make_error("hc_split_sinkhorn: ", sinkhorn_iters, " iterations (need ≥ 1)");
  if (n_tokens <= 0) return {};
  const unsigned grid = grid_for(n_tokens, kSinkhornWarps), block = 32 * kSinkhornWarps;
  switch (hc) {
    case 4:
      launch(hc_split_sinkhorn_small_kernel<4>, grid, block, 0, stream, mixes, scale, base, n_tokens, sinkhorn_iters, hc_eps, pre, post, comb);
      break;
    case 2:
      launch(hc_split_sinkhorn_small_kernel<2>, grid, block, 0, stream, mixes, scale, base, n_tokens, sinkhorn_iters, hc_eps, pre, post, comb);
      break;
    default:
      launch(hc_split_sinkhorn_kernel, grid, block, 0, stream, mixes, scale, base, n_tokens, hc, sinkhorn_iters, hc_eps,
                                                           pre, post, comb);
  }
  return launch_status("hc_split_sinkhorn_kernel");
}

Status hc_head_pre(const float* mixes, const float* scale, const float* base, int64_t n_tokens, int hc, float hc_eps,
                   float* pre, cudaStream_t stream) {
  SPW_TRY(check_hc("hc_head_pre", hc));
  if (n_tokens <= 0) return {};
  launch(hc_head_pre_kernel, grid_for(n_tokens * hc, 128), 128, 0, stream, mixes, scale, base, n_tokens, hc, hc_eps, pre);
  return launch_status("hc_head_pre_kernel");
}

Status hc_collapse(const float* x_streams, const float* pre, int64_t n_tokens, int hc, int64_t d, bool round_out,
                   float* y, cudaStream_t stream) {
  SPW_TRY(check_hc("hc_collapse", hc));
  if (n_tokens <= 0 || d <= 0) return {};
  launch(hc_collapse_kernel, grid_for(n_tokens * d, kThreads), kThreads, 0, stream, x_streams, pre, n_tokens, hc, d,
                                                                                 round_out, y);
  return launch_status("hc_collapse_kernel");
}

Status hc_expand(float* x_streams, const float* y, const float* post, const float* comb, int64_t n_tokens, int hc,
                 int64_t d, bool round_out, cudaStream_t stream) {
  SPW_TRY(check_hc("hc_expand", hc));
  if (n_tokens <= 0 || d <= 0) return {};
  launch(hc_expand_kernel, grid_for(n_tokens * d, kThreads), kThreads, 0, stream, x_streams, y, post, comb, n_tokens, hc,
                                                                               d, round_out);
  return launch_status("hc_expand_kernel");
}

}  // namespace spw::cuda
