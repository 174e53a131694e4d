// Sparse attention on tensor cores (contract in sparse_attn.h; shared pieces in sparse_attn_tile.cuh).
//
// The tensor-core path (prefill and large batches): one block per (16 or 32 heads, query), the heads being the m16
// tiles of mma.m16n8k16 (bf16 inputs, f32 accumulation). Pass 1: S = Q·Kᵀ per segment (warp w: head tile w / 4,
// rows 8·(w % 4) .. + 7 of the segment, over all of d), logits into shared memory; then each head's max and
// Σ p_j; pass 2: O += P̃·V per segment (warp w: output channels [w·d/8, (w+1)·d/8) of every head). Exact inputs: q is bf16
// (SparseAttnArgs::q_bf16), every stored row value is bf16-representable (e4m3·2^k, e2m1·e4m3, bf16) and p̃ is
// bf16 (round_p_bf16), so each product is exact and only the order of the f32 sums differs from the other paths.
//
// The split path on tensor cores (decode-sized calls with the tensor-core path's inputs): one block per (16 heads,
// query, segment), the blocks of a (query, segment) a cluster sharing the decoded rows (load_segment_shared), then
// split_combine_kernel as for the scalar split. Logits: warp w < 4 the segment's rows 8w .. 8w + 7 (the one-block
// kernel's fragment loop); sums: p̃ from the query's max, O_seg = P̃·V per warp's channels from zero, Σ p in row
// order. The segments meet in the combine in order.
// Tests: tests/gpu/test_cuda_attn_sparse.cpp.
#include <cuda_bf16.h>

#include "cuda/attn/sparse_attn_tile.cuh"
#include "cuda/launch.h"  // the kernels here keep its PDL contract (tests/python/test_pdl_contract.py)

namespace spw::cuda::attn {
namespace {

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c += A·B for one m16n8k16 tile: a0..a3 A's fragment (rows g, g + 8; k pairs 2t, 2t + 8), b0, b1 B's (k pairs 2t,
// 2t + 8; column g), c rows g and g + 8 at columns 2t, 2t + 1 (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// q of heads h0 .. h0 + n − 1 of query i as bf16 pairs into qs [n, q_ld] (zeros past n_heads).
__device__ __forceinline__ void stage_q(const SparseAttnArgs& a, int i, int h0, int n, uint32_t* qs, int q_ld) {
  const int d = a.d_head;
  for (int e = threadIdx.x; e < n * (d / 2); e += blockDim.x) {
    const int h = e / (d / 2), c = 2 * (e % (d / 2));
    float2 v = make_float2(0.f, 0.f);
    if (h0 + h < a.n_heads) v = *reinterpret_cast<const float2*>(a.q + (int64_t(i) * a.n_heads + h0 + h) * d + c);
    qs[h * q_ld + c / 2] = pack_bf16(v.x, v.y);
  }
}

// Q·Kᵀ of one head tile (16 rows of q from qt, bf16 pairs, row stride q_ld) and the tile rows n0 .. n0 + 7, over all
// d channels: c[e] for head g + 8·(e / 2) and row n0 + 2t + e % 2 (the C fragment).
__device__ __forceinline__ void segment_logits_mma(const SegmentTile& t, const uint32_t* qt, int q_ld, int n0, int d,
                                                   int lane, float (&c)[4]) {
  const int g = lane >> 2, tg = lane & 3;
  c[0] = c[1] = c[2] = c[3] = 0.f;
  const float* brow = t.rows + size_t(n0 + g) * t.ld + 2 * tg;
  const uint32_t* qa = qt + g * q_ld + tg;
  for (int k0 = 0; k0 < d; k0 += 16) {
    const float2 x = *reinterpret_cast<const float2*>(brow + k0), y = *reinterpret_cast<const float2*>(brow + k0 + 8);
    mma_bf16(c, qa[k0 / 2], qa[8 * q_ld + k0 / 2], qa[k0 / 2 + 4], qa[8 * q_ld + k0 / 2 + 4], pack_bf16(x.x, x.y),
             pack_bf16(y.x, y.y));
  }
}

// acc[m][j] += P̃·V for MT head tiles (p̃ of the segment's 32 rows in ps, bf16 pairs, row stride kMmaPLd) and the
// tile's rows at channels ch0 + 8j .. + 7, j < nt: acc[m][j][e] for head 16m + g + 8·(e / 2), channel
// ch0 + 8j + 2t + e % 2.
template <int MT, int NT>
__device__ __forceinline__ void segment_pv_mma(const SegmentTile& t, const uint32_t* ps, int ch0, int nt, int lane,
                                               float (&acc)[MT][NT][4]) {
  const int g = lane >> 2, tg = lane & 3;
#pragma unroll
  for (int ks = 0; ks < kSegRows; ks += 16) {
    uint32_t pa[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const uint32_t* pm = ps + (16 * m + g) * kMmaPLd + ks / 2 + tg;
      pa[m][0] = pm[0], pa[m][1] = pm[8 * kMmaPLd], pa[m][2] = pm[4], pa[m][3] = pm[8 * kMmaPLd + 4];
    }
    const float* v = t.rows + size_t(ks + 2 * tg) * t.ld + ch0 + g;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (j >= nt) break;
      const float* vj = v + 8 * j;
      const uint32_t b0 = pack_bf16(vj[0], vj[t.ld]), b1 = pack_bf16(vj[8 * t.ld], vj[9 * t.ld]);
#pragma unroll
      for (int m = 0; m < MT; ++m) mma_bf16(acc[m][j], pa[m][0], pa[m][1], pa[m][2], pa[m][3], b0, b1);
    }
  }
}

// A skipped row's p̃ is 0, and 0·(stale bytes) must stay 0: its tile row is zeroed (a warp per row).
__device__ __forceinline__ void zero_skipped_rows(const SegmentTile& t, int d) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int r = warp; r < kSegRows; r += warps)
    if (t.kinds[r] == kSkipped)
      for (int c = lane; c < d; c += 32) t.rows[size_t(r) * t.ld + c] = 0.f;
}

// MT m16 tiles of heads per block (1 or 2): two halve the row decoding per query, if their logits fit.
template <int CPL, int MT>
__global__ void __launch_bounds__(kMmaThreads, 1) sparse_attn_mma_kernel(SparseAttnArgs a, Layouts layouts,
                                                                      size_t ring_nbytes, size_t comp_nbytes,
                                                                      int64_t max_rows) {
  constexpr int NT = CPL / 2;  // n8 tiles of output channels per warp at most (d ≤ 32·CPL = 64·NT)
  constexpr int kHeads = 16 * MT;
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int i = blockIdx.y, h0 = blockIdx.x * kHeads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int d = a.d_head, nt = d / 64, g = lane >> 2, tg = lane & 3;
  SegmentTile t;
  unsigned char* p = carve_tile(smem_raw, d, raw_row_words(ring_nbytes, comp_nbytes), t, d + kMmaRowPad);
  p = smem_raw + (p - smem_raw + 15) / 16 * 16;
  const int q_ld = d / 2 + kMmaQPad;
  const int64_t l_ld = mma_logit_ld(max_rows);
  uint32_t* qs = reinterpret_cast<uint32_t*>(p);
  float* logits = reinterpret_cast<float*>(qs + kHeads * q_ld);
  uint32_t* ps = reinterpret_cast<uint32_t*>(logits + kHeads * l_ld);
  float* head_max = reinterpret_cast<float*>(ps + kHeads * kMmaPLd);
  float* head_den = head_max + kHeads;

  const QueryRows qr = query_rows(a, i, ring_nbytes, comp_nbytes);
  stage_q(a, i, h0, kHeads, qs, q_ld);

  // Pass 1: logits (−∞ for skipped rows and rows past the query's end); warp w: head tile w / 4, rows 8·(w % 4)
  // .. + 7 of the segment, over all of d. load_segment's first barrier orders q.
  for (int64_t seg0 = 0; seg0 < qr.n_rows; seg0 += kSegRows) {
    load_segment<CPL>(a, layouts, qr, seg0, t);
    const int mt = warp / (kSegRows / 8), n0 = 8 * (warp % (kSegRows / 8));
    if (mt >= MT) continue;
    float c[4];
    segment_logits_mma(t, qs + 16 * mt * q_ld, q_ld, n0, d, lane, c);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = 16 * mt + g + 8 * (e >> 1), r = n0 + 2 * tg + (e & 1);
      const bool skip = seg0 + r >= qr.n_rows || t.kinds[r] == kSkipped;
      logits[h * l_ld + seg0 + r] = skip ? -INFINITY : c[e] * a.scale;
    }
  }
  __syncthreads();

  // Each head's max and Σ p_j (f32, lane-strided then a butterfly): warp w takes heads 2·MT·w .. + 2·MT − 1.
  for (int hh = 0; hh < kHeads / kMmaWarps; ++hh) {
    const int h = warp * (kHeads / kMmaWarps) + hh;
    const float* lh = logits + h * l_ld;
    float m = -INFINITY;
    for (int64_t r = lane; r < qr.n_rows; r += 32) m = fmaxf(m, lh[r]);
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float den = 0.f;
    if (m != -INFINITY)
      for (int64_t r = lane; r < qr.n_rows; r += 32) den += expf(lh[r] - m);
    for (int off = 16; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffffu, den, off);
    if (lane == 0) head_max[h] = m, head_den[h] = den;
  }
  __syncthreads();

  // Pass 2: O[heads, this warp's channels] += P̃·V, segment by segment.
  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.f;
  const int ch0 = warp * (d / kMmaWarps);
  for (int64_t seg0 = 0; seg0 < qr.n_rows; seg0 += kSegRows) {
    load_segment<CPL>(a, layouts, qr, seg0, t);
    zero_skipped_rows(t, d);
    for (int e = threadIdx.x; e < kHeads * (kSegRows / 2); e += blockDim.x) {
      const int h = e / (kSegRows / 2), r = 2 * (e % (kSegRows / 2));
      const float m = head_max[h];
      auto pj = [&](int rr) {
        const int64_t j = seg0 + rr;
        return m == -INFINITY || j >= qr.n_rows ? 0.f : expf(logits[h * l_ld + j] - m);
      };
      ps[h * kMmaPLd + r / 2] = pack_bf16(pj(r), pj(r + 1));  // p̃ = bf16(p)
    }
    __syncthreads();
    segment_pv_mma<MT, NT>(t, ps, ch0, nt, lane, acc);
  }
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (j >= nt) break;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = 16 * m + g + 8 * (e >> 1), c = ch0 + 8 * j + 2 * tg + (e & 1);
        if (h0 + h >= a.n_heads) continue;
        const float hm = head_max[h];
        const float v = hm == -INFINITY ? 0.f : acc[m][j][e] / (head_den[h] + expf(a.sink[h0 + h] - hm));
        a.out[(int64_t(i) * a.n_heads + h0 + h) * d + c] = v;  // no rows: only the sink, the output is zero
      }
    }
}

struct SplitMmaBlock {
  QueryRows qr;
  int64_t seg0;
  SegmentTile t;
  uint32_t* qs;
  float* lg;
  uint32_t* ps;
  float* hm;
  int h0, q_ld;
};

__device__ SplitMmaBlock split_mma_block(const SparseAttnArgs& a, unsigned char* smem, size_t ring_nbytes,
                                         size_t comp_nbytes) {
  SplitMmaBlock b;
  b.qr = query_rows(a, blockIdx.y, ring_nbytes, comp_nbytes);
  b.seg0 = int64_t(blockIdx.z) * kSegRows;
  b.h0 = int(blockIdx.x) * 16;
  b.q_ld = a.d_head / 2 + kMmaQPad;
  unsigned char* p = carve_tile(smem, a.d_head, raw_row_words(ring_nbytes, comp_nbytes), b.t, a.d_head + kMmaRowPad);
  p = smem + (p - smem + 15) / 16 * 16;
  b.qs = reinterpret_cast<uint32_t*>(p);
  b.lg = reinterpret_cast<float*>(b.qs + 16 * b.q_ld);
  b.ps = reinterpret_cast<uint32_t*>(b.lg + 16 * kSegRows);
  b.hm = reinterpret_cast<float*>(b.ps + 16 * kMmaPLd);
  return b;
}

template <int CPL>
__global__ void __launch_bounds__(kMmaThreads, 1) split_logits_mma_kernel(SparseAttnArgs a, Layouts layouts,
                                                                       SplitScratch s, size_t ring_nbytes,
                                                                       size_t comp_nbytes) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int i = blockIdx.y, seg = blockIdx.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = a.d_head;
  const int g = lane >> 2, tg = lane & 3;
  const SplitMmaBlock b = split_mma_block(a, smem_raw, ring_nbytes, comp_nbytes);
  if (b.seg0 >= b.qr.n_rows) return;  // the whole cluster: its blocks share (query, segment)
  stage_q(a, i, b.h0, 16, b.qs, b.q_ld);
  load_segment_shared<CPL>(a, layouts, b.qr, b.seg0, b.t);  // its barriers also publish q
  if (warp < kSegRows / 8) {
    const int n0 = 8 * warp;
    float c[4];
    segment_logits_mma(b.t, b.qs, b.q_ld, n0, d, lane, c);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = g + 8 * (e >> 1), r = n0 + 2 * tg + (e & 1);
      const bool skip = b.seg0 + r >= b.qr.n_rows || b.t.kinds[r] == kSkipped;
      b.lg[h * kSegRows + r] = skip ? -INFINITY : c[e] * a.scale;
    }
  }
  __syncthreads();
  for (int h = warp; h < 16; h += kMmaWarps) {  // a warp per head: the rows' logits and their max
    if (b.h0 + h >= a.n_heads) continue;
    const int64_t qh = int64_t(i) * a.n_heads + b.h0 + h;
    const float l = b.lg[h * kSegRows + lane];
    if (b.seg0 + lane < b.qr.n_rows) s.logits[qh * s.max_rows + b.seg0 + lane] = l;
    float m = l;
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) s.seg_max[qh * s.n_seg + seg] = m;
  }
}

template <int CPL>
__global__ void __launch_bounds__(kMmaThreads, 1) split_sums_mma_kernel(SparseAttnArgs a, Layouts layouts,
                                                                     SplitScratch s, size_t ring_nbytes,
                                                                     size_t comp_nbytes) {
  constexpr int NT = CPL / 2;
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int i = blockIdx.y, seg = blockIdx.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = a.d_head;
  const int g = lane >> 2, tg = lane & 3, nt = d / 64;
  const SplitMmaBlock b = split_mma_block(a, smem_raw, ring_nbytes, comp_nbytes);
  if (b.seg0 >= b.qr.n_rows) return;
  for (int h = warp; h < 16; h += kMmaWarps) {  // each head's max over the query's segments (query_max)
    const float m = b.h0 + h < a.n_heads
                        ? query_max(s, int64_t(i) * a.n_heads + b.h0 + h, segments_of(b.qr.n_rows), lane)
                        : -INFINITY;
    if (lane == 0) b.hm[h] = m;
  }
  load_segment_shared<CPL>(a, layouts, b.qr, b.seg0, b.t);  // its barriers also publish the maxima
  zero_skipped_rows(b.t, d);
  for (int e = threadIdx.x; e < 16 * kSegRows; e += blockDim.x) {  // p of every (head, row)
    const int h = e / kSegRows, r = e % kSegRows;
    const float m = b.hm[h];
    const bool none = m == -INFINITY || b.seg0 + r >= b.qr.n_rows || b.h0 + h >= a.n_heads;
    b.lg[h * kSegRows + r] =
        none ? 0.f : expf(s.logits[(int64_t(i) * a.n_heads + b.h0 + h) * s.max_rows + b.seg0 + r] - m);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < 16 * (kSegRows / 2); e += blockDim.x) {  // p̃ = bf16(p) as pairs
    const int h = e / (kSegRows / 2), r = 2 * (e % (kSegRows / 2));
    b.ps[h * kMmaPLd + r / 2] = pack_bf16(b.lg[h * kSegRows + r], b.lg[h * kSegRows + r + 1]);
  }
  for (int h = warp; h < 16; h += kMmaWarps) {  // Σ p of the segment, rows in order
    if (b.h0 + h >= a.n_heads || lane != 0) continue;
    float den = 0.f;
    for (int r = 0; r < kSegRows; ++r) den += b.lg[h * kSegRows + r];
    s.seg_den[(int64_t(i) * a.n_heads + b.h0 + h) * s.n_seg + seg] = den;
  }
  __syncthreads();
  float acc[1][NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.f;
  const int ch0 = warp * (d / kMmaWarps);
  segment_pv_mma<1, NT>(b.t, b.ps, ch0, nt, lane, acc);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    if (j >= nt) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = g + 8 * (e >> 1), c = ch0 + 8 * j + 2 * tg + (e & 1);
      if (b.h0 + h >= a.n_heads || b.hm[h] == -INFINITY) continue;  // the combine writes zeros
      s.seg_sum[((int64_t(i) * a.n_heads + b.h0 + h) * s.n_seg + seg) * d + c] = acc[0][j][e];
    }
  }
}
}  // namespace

Status launch_attn_mma(const SparseAttnArgs& a, const Layouts& layouts, size_t ring_nbytes, size_t comp_nbytes,
                       int64_t max_rows, int mt, size_t smem, cudaStream_t stream) {
  const dim3 grid(unsigned((a.n_heads + 16 * mt - 1) / (16 * mt)), unsigned(a.n_q));
  return with_channels_per_lane(channels_per_lane(a.d_head), [&](auto k) -> Status {
    constexpr int CPL = decltype(k)::value;
    auto go = [&](auto kernel) -> Status {
      SPW_TRY(set_smem(reinterpret_cast<const void*>(kernel), smem, "sparse_attn_mma_kernel shared memory"));
      launch(kernel, grid, kMmaThreads, smem, stream, a, layouts, ring_nbytes, comp_nbytes, max_rows);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch sparse_attn_mma_kernel", e);
      return {};
    };
    return mt == 2 ? go(sparse_attn_mma_kernel<CPL, 2>) : go(sparse_attn_mma_kernel<CPL, 1>);
  });
}

Status launch_split_attn_mma(const SparseAttnArgs& a, const Layouts& layouts, const SplitScratch& s,
                             size_t ring_nbytes, size_t comp_nbytes, cudaStream_t stream) {
  const dim3 grid(unsigned((a.n_heads + 15) / 16), unsigned(a.n_q), unsigned(s.n_seg));
  const size_t smem = split_mma_smem_bytes(a.d_head, raw_row_words(ring_nbytes, comp_nbytes));
  return with_channels_per_lane(channels_per_lane(a.d_head), [&](auto k) -> Status {
    constexpr int CPL = decltype(k)::value;
    return launch_split_pair(split_logits_mma_kernel<CPL>, split_sums_mma_kernel<CPL>, grid, dim3(kMmaThreads), smem,
                             stream, a, layouts, s, ring_nbytes, comp_nbytes, "split attention on tensor cores");
  });
}

}  // namespace spw::cuda::attn
