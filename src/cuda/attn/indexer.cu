// Indexer scores, top-k selection and V4.1's candidate blocks on the GPU (contract in indexer.h).
//
// index_scores: one warp per (query, entry); the query's q (rows padded by one float, so the lanes'
// different heads fall on different banks) and w sit in shared memory, the warp dequantizes the key
// into shared memory once, lane l computes the terms of heads l, l + 32 (each dot product in the
// reference's channel order), and lane 0 adds the terms in head order: the reference's operations in
// its order, bit for bit. The first version (one thread per entry looping over all heads) took
// 129 µs per V4.1 decode call on the H200 (512 entries: 4 blocks).
// topk_select: one block per row. A radix select over order-preserving 32-bit keys (4 passes of 8
// bits, shared-memory histograms) finds the k-th largest key T and how many elements equal to T
// are taken (the lowest-index ones); one ordered pass with block scans then writes the picks
// ascending by index. Correctness first: each pass reads the row again (n ≤ ~1 M per row).
// Tests: tests/gpu/test_cuda_attn_indexer.cpp.
#include "cuda/attn/indexer.h"

#include <cub/block/block_scan.cuh>

#include <cmath>

#include "cuda/attn/kv_device.cuh"
#include "cuda/launch.h"

namespace spw::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxDIndex = 128;
constexpr int kMaxIndexHeads = 64;
constexpr int kTopkThreads = 512;

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

Status launched(const char* what) {
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error(what, e);
  return {};
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

__device__ __forceinline__ float maybe_bf16(float v, bool round) { return round ? kvdev::bf16_round(v) : v; }

constexpr int kScoreWarps = kThreads / 32;  // entries per block and round
// Rounds of kScoreWarps entries per block (IndexScoreArgs::rounds): the block stages its query's q (H·D floats,
// 32 KB for V4.1) once for up to 32 entries instead of 4 (a 4096-token V4.1 chunk re-read ~30 GB of q from L2 at one
// round: 14.1 → 6.4 ms per call at 8 rounds); decode steps (a few queries) keep one round, or their grid would not
// fill the GPU (one query: 7 → 26 µs at 8 rounds).
constexpr int kMaxScoreRounds = 8;
int score_rounds(const IndexScoreArgs& a) {
  if (a.rounds > 0) return a.rounds < kMaxScoreRounds ? a.rounds : kMaxScoreRounds;
  static const int min_blocks = [] {  // four waves of blocks
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return 4 * (sms > 0 ? sms : 1);
  }();
  int r = kMaxScoreRounds;
  while (r > 1 && int64_t(a.n_q) * ((a.max_entries + int64_t(kScoreWarps) * r - 1) / (int64_t(kScoreWarps) * r)) < min_blocks)
    r /= 2;
  return r;
}
constexpr int kQPad = kMaxDIndex + 1;

__global__ void __launch_bounds__(kThreads) index_scores_kernel(IndexScoreArgs a, size_t key_nbytes, int rounds) {
  pdl_enter();
  __shared__ float q_s[kMaxIndexHeads * kQPad];
  __shared__ float w_s[kMaxIndexHeads];
  __shared__ float k_s[kScoreWarps][kMaxDIndex];
  __shared__ float terms[kScoreWarps][kMaxIndexHeads];
  const int i = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = a.d_index, H = a.n_heads;
  for (int c = threadIdx.x; c < H * D; c += kThreads) q_s[(c / D) * kQPad + c % D] = a.q[int64_t(i) * H * D + c];
  for (int h = threadIdx.x; h < H; h += kThreads) w_s[h] = a.w[int64_t(i) * H + h];
  __syncthreads();
  const int64_t n_entries = a.n_entries[i], visible = a.visible[i];
  for (int round = 0; round < rounds; ++round) {
    const int64_t g = (int64_t(blockIdx.x) * rounds + round) * kScoreWarps + warp;
    if (g >= n_entries) break;  // the whole warp; only __syncwarp below
    float* out = a.scores + int64_t(i) * a.score_stride + g;
    if (g >= visible) {
      if (lane == 0) *out = -INFINITY;
      continue;
    }
    const uint8_t* row = kvdev::row_ptr(a.keys, key_nbytes, a.q_seq[i], g);
    for (int c = lane; c < D; c += 32) k_s[warp][c] = kvdev::load_channel(a.keys.fmt, row, c);
    __syncwarp();
    for (int h = lane; h < H; h += 32) {
      const float* qh = q_s + h * kQPad;
      float dot = 0.f;
      for (int c = 0; c < D; ++c) dot = __fadd_rn(dot, __fmul_rn(qh[c], k_s[warp][c]));
      const float rd = maybe_bf16(dot, a.round_bf16);
      const float relu = rd < 0.f ? 0.f : rd;  // std::max(rd, 0.f)
      terms[warp][h] = maybe_bf16(__fmul_rn(relu, w_s[h]), a.round_bf16);
    }
    __syncwarp();
    if (lane == 0) {
      float acc = 0.f;
      for (int h = 0; h < H; ++h) acc = __fadd_rn(acc, terms[warp][h]);
      *out = maybe_bf16(acc, a.round_bf16);
    }
    __syncwarp();  // k_s and terms are this warp's again next round
  }
}

// Larger float ⇔ larger key; −0 and +0 share a key (they compare equal).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v == 0.f) v = 0.f;
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__global__ void __launch_bounds__(kTopkThreads) topk_select_kernel(const float* __restrict__ values, int64_t stride,
                                                                   const int64_t* __restrict__ n_per_row, int32_t k,
                                                                   int32_t* __restrict__ out, int32_t out_stride) {
  pdl_enter();
  using Scan = cub::BlockScan<int, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256];
  __shared__ int pick_digit, pick_remaining;
  const int row = blockIdx.x, tid = threadIdx.x;
  const float* v = values + int64_t(row) * stride;
  int32_t* o = out + int64_t(row) * out_stride;
  const int64_t n = n_per_row[row];
  const int kk = int(n < k ? n : k);

  // Radix select: the kk-th largest key T; `need` = how many elements equal to T are taken.
  uint32_t prefix = 0, mask = 0;
  int remaining = kk;
  for (int shift = 24; shift >= 0 && kk > 0; shift -= 8) {
    for (int b = tid; b < 256; b += kTopkThreads) hist[b] = 0;
    __syncthreads();
    for (int64_t j = tid; j < n; j += kTopkThreads) {
      const uint32_t key = order_key(v[j]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (tid == 0) {
      int cum = 0, d = 255;
      for (; d > 0; --d) {
        if (cum + hist[d] >= remaining) break;
        cum += hist[d];
      }
      pick_digit = d;
      pick_remaining = remaining - cum;
    }
    __syncthreads();
    prefix |= uint32_t(pick_digit) << shift;
    mask |= 255u << shift;
    remaining = pick_remaining;
    __syncthreads();  // hist and the picks are rewritten by the next pass
  }
  const uint32_t T = prefix;
  const int need = remaining;

  // Ordered compaction: take key > T and the first `need` keys == T; drop the −∞ picks.
  int eq_seen = 0, out_seen = 0;
  for (int64_t base = 0; base < n && kk > 0; base += kTopkThreads) {
    const int64_t j = base + tid;
    const float x = j < n ? v[j] : -INFINITY;
    const uint32_t key = order_key(x);
    const bool in = j < n;
    const int eq = in && key == T;
    int eq_before, eq_total;
    Scan(scan_tmp).ExclusiveSum(eq, eq_before, eq_total);
    __syncthreads();
    const bool take = in && (key > T || (eq && eq_seen + eq_before < need));
    const int keep = take && x != -INFINITY;
    int out_before, out_total;
    Scan(scan_tmp).ExclusiveSum(keep, out_before, out_total);
    __syncthreads();
    if (keep) o[out_seen + out_before] = int32_t(j);
    eq_seen += eq_total;
    out_seen += out_total;
  }
  for (int j = (kk > 0 ? out_seen : 0) + tid; j < out_stride; j += kTopkThreads) o[j] = -1;
}

__global__ void candidate_block_scores_kernel(const float* __restrict__ scores, int64_t score_stride,
                                              const int64_t* __restrict__ n_entries, const int64_t* __restrict__ visible,
                                              int32_t block_size, float* __restrict__ block_scores,
                                              int64_t block_stride, int64_t* __restrict__ n_blocks) {
  pdl_enter();
  const int i = blockIdx.y;
  const int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t n = n_entries[i];
  const int64_t nb = (n + block_size - 1) / block_size;
  if (b == 0) n_blocks[i] = nb;
  if (b >= nb) return;
  const int64_t newest = visible[i] - 1;
  float m = -INFINITY;
  for (int64_t g = b * block_size; g < n && g < (b + 1) * block_size; ++g) {
    const float s = scores[int64_t(i) * score_stride + g];
    m = m < s ? s : m;  // std::max(m, s)
  }
  if (newest >= 0 && newest / block_size == b) m = INFINITY;
  block_scores[int64_t(i) * block_stride + b] = m;
}

__global__ void candidate_mask_kernel(const int32_t* __restrict__ kept, int32_t kept_stride,
                                      const int64_t* __restrict__ n_entries, int32_t block_size,
                                      uint8_t* __restrict__ mask, int64_t mask_stride) {
  pdl_enter();
  const int i = blockIdx.y;
  const int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (g >= n_entries[i]) return;
  const int32_t* ki = kept + int64_t(i) * kept_stride;
  const int64_t b = g / block_size;
  int lo = 0, hi = kept_stride;  // first position with kept ≥ b (−1 padding counts as +∞)
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    const int64_t kb = ki[mid] < 0 ? INT64_MAX : ki[mid];
    if (kb < b) lo = mid + 1;
    else hi = mid;
  }
  mask[int64_t(i) * mask_stride + g] = (lo < kept_stride && ki[lo] == b) ? 1 : 0;
}

__global__ void apply_mask_kernel(float* __restrict__ scores, int64_t score_stride, const int64_t* __restrict__ n_entries,
                                  const uint8_t* __restrict__ mask, int64_t mask_stride) {
  pdl_enter();
  const int i = blockIdx.y;
  const int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (g >= n_entries[i]) return;
  if (!mask[int64_t(i) * mask_stride + g]) scores[int64_t(i) * score_stride + g] = -INFINITY;
}

}  // namespace

Status index_scores_cuda(const IndexScoreArgs& a, cudaStream_t stream) {
  if (a.n_q <= 0 || a.max_entries <= 0) return {};
  if (a.d_index <= 0 || a.d_index > kMaxDIndex || a.n_heads <= 0 || a.n_heads > kMaxIndexHeads)
    return make_error("index_scores_cuda: unsupported shape n_heads=", a.n_heads, " d_index=", a.d_index);
  if (kv_row_channels(a.keys.fmt) != a.d_index || !kv_format_supported(a.keys.fmt))
    return make_error("index_scores_cuda: key row format does not match d_index=", a.d_index);
  const int rounds = score_rounds(a);
  const int64_t per_block = int64_t(kScoreWarps) * rounds;
  const dim3 grid(unsigned((a.max_entries + per_block - 1) / per_block), unsigned(a.n_q));
  launch(index_scores_kernel, grid, kThreads, 0, stream, a, kv_row_nbytes(a.keys.fmt), rounds);
  return launched("launch index_scores_kernel");
}

Status topk_select_cuda(const float* values, int64_t stride, const int64_t* n, int32_t n_rows, int32_t k,
                        int32_t* out, int32_t out_stride, cudaStream_t stream) {
  if (n_rows <= 0) return {};
  if (k < 0 || k > out_stride) return make_error("topk_select_cuda: k=", k, " > out_stride=", out_stride);
  launch(topk_select_kernel, unsigned(n_rows), kTopkThreads, 0, stream, values, stride, n, k, out, out_stride);
  return launched("launch topk_select_kernel");
}

Status candidate_block_scores_cuda(const float* scores, int64_t score_stride, const int64_t* n_entries,
                                   const int64_t* visible, int32_t n_q, int64_t max_entries, int32_t block_size,
                                   float* block_scores, int64_t block_stride, int64_t* n_blocks,
                                   cudaStream_t stream) {
  if (n_q <= 0) return {};
  if (block_size <= 0) return make_error("candidate_block_scores_cuda: block_size=", block_size);
  const int64_t max_blocks = (max_entries + block_size - 1) / block_size;
  const dim3 grid(blocks_for(max_blocks > 0 ? max_blocks : 1), unsigned(n_q));
  launch(candidate_block_scores_kernel, grid, kThreads, 0, stream, scores, score_stride, n_entries, visible, block_size,
                                                               block_scores, block_stride, n_blocks);
  return launched("launch candidate_block_scores_kernel");
}

Status candidate_mask_cuda(const int32_t* kept, int32_t kept_stride, const int64_t* n_entries, int32_t n_q,
                           int64_t max_entries, int32_t block_size, uint8_t* mask, int64_t mask_stride,
                           cudaStream_t stream) {
  if (n_q <= 0 || max_entries <= 0) return {};
  if (block_size <= 0) return make_error("candidate_mask_cuda: block_size=", block_size);
  const dim3 grid(blocks_for(max_entries), unsigned(n_q));
  launch(candidate_mask_kernel, grid, kThreads, 0, stream, kept, kept_stride, n_entries, block_size, mask, mask_stride);
  return launched("launch candidate_mask_kernel");
}

Status index_scores_apply_mask_cuda(float* scores, int64_t score_stride, const int64_t* n_entries, int32_t n_q,
                                    int64_t max_entries, const uint8_t* mask, int64_t mask_stride,
                                    cudaStream_t stream) {
  if (n_q <= 0 || max_entries <= 0) return {};
  const dim3 grid(blocks_for(max_entries), unsigned(n_q));
  launch(apply_mask_kernel, grid, kThreads, 0, stream, scores, score_stride, n_entries, mask, mask_stride);
  return launched("launch apply_mask_kernel");
}

}  // namespace spw::cuda
