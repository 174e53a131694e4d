// Sparse attention with sinks over compact paged KV (contract in sparse_attn.h).
//
// K = V rows are shared by every head (one latent row per position), so a block takes one query and a
// group of up to kMaxHeadsPerBlock heads, one warp per head, and dequantizes each row once into shared
// memory for all of them. Rows are dequantized by kvdev::layout_channel (offsets resolved once per call,
// codes and scales decoded by bit assembly). The earlier kernel took one (head, query) per block and
// decoded every row once per head and pass: 64 decodes of each channel per decode call, which made it
// instruction-bound (150 µs per decode call at 1 K context, 379 ms per 4096-token prefill call on the
// H200; bench/results/engine_h200.md, session 6).
//
// The arithmetic, shared by both paths below so that they give bit-identical results:
//   logits: ℓ_j = (q·c_j)·scale: lane l sums q[c]·c_j[c] over c = l, l + 32, ... in order, then an
//           xor-shuffle sum over lanes; −∞ for skipped rows; m = max_j ℓ_j (exact); p_j = expf(ℓ_j − m);
//   sums:   the rows are cut into segments of kSegRows = 32 by row index, each into 4 chunks of
//           kChunkRows = 8; a chunk sums p̃_j·c_j and p_j in row order; a segment's sum is its chunk
//           sums added in chunk order; the result is the segment sums added in segment order, divided by
//           (Σ segment denominators + expf(sink − m)).
// Which partial sum a row lands in depends on its index only — not on the row count, which grows with
// padding (V4's HCA selections are padded with −1 to the longest sequence of the step), and not on the
// path — so a query's result does not depend on the other queries of the call.
//
// Paths:
//   one block per (head group, query) (prefill, large batches): pass 1 walks the segments computing the
//     logits into shared memory, pass 2 walks them again for the sums;
//   split (decode, n_q·n_heads ≤ kSparseAttnSplitMaxBlocks, with caller scratch): one block per (head
//     group, query, segment) in three launches — logits and segment maxima, segment sums, then the
//     combine — because a decode call has one query per sequence for 132 SMs.
// Tests: tests/gpu/test_cuda_attn_sparse.cpp.
#include "cuda/attn/sparse_attn.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cuda/attn/kv_device.cuh"
#include "cuda/launch.h"

namespace spw::cuda {

namespace {

constexpr int kMaxHeadsPerBlock = 8;             // one warp per head
constexpr int kMaxThreads = 32 * kMaxHeadsPerBlock;
constexpr int kChunkRows = 8;                    // rows per chunk
constexpr int kSegRows = 4 * kChunkRows;         // rows per segment: also the rows in shared memory at once
constexpr int kMaxChannelsPerLane = 1024 / 32;   // d_head ≤ 1024
// Shared memory of one block (H100/H200 allow 227 KiB with the opt-in).
constexpr size_t kMaxSmem = 227 * 1024;

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

// Kinds of a row-table entry.
enum RowKind : uint8_t { kSkipped = 0, kF32 = 1, kRing = 2, kComp = 3 };

// The three layouts a row can have, indexed by RowKind (kSkipped's entry is unused).
struct Layouts {
  kvdev::RowLayout by_kind[4];
};

// The layout of a row of this kind, by value. Constant indices only: indexing the kernel-parameter array
// with the runtime kind makes the compiler copy it to local memory and reload fields per channel.
__device__ __forceinline__ kvdev::RowLayout layout_of(const Layouts& layouts, RowKind kind) {
  return kind == kRing ? layouts.by_kind[kRing] : kind == kComp ? layouts.by_kind[kComp] : layouts.by_kind[kF32];
}

struct QueryRows {
  int32_t seq;
  int64_t lo, n_win, chunk_pos0, n_rows;
  int32_t chunk_row0;
  const int32_t* sel;
  size_t ring_nbytes, comp_nbytes;
};

__device__ QueryRows query_rows(const SparseAttnArgs& a, int i, size_t ring_nbytes, size_t comp_nbytes) {
  QueryRows qr;
  qr.seq = a.q_seq[i];
  const int64_t t = a.q_pos[i];
  qr.lo = t - a.window + 1 > 0 ? t - a.window + 1 : 0;
  qr.n_win = t - qr.lo + 1;
  qr.chunk_pos0 = a.chunk_pos0[i];
  qr.chunk_row0 = a.chunk_row0[i];
  qr.sel = a.sel ? a.sel + int64_t(i) * a.sel_stride : nullptr;
  qr.ring_nbytes = ring_nbytes;
  qr.comp_nbytes = comp_nbytes;
  qr.n_rows = qr.n_win + (a.sel ? a.sel_stride : 0);
  return qr;
}

__device__ __host__ inline int segments_of(int64_t n_rows) { return int((n_rows + kSegRows - 1) / kSegRows); }

// Where row j of the query lives (kind and address).
__device__ RowKind resolve_row(const SparseAttnArgs& a, const QueryRows& qr, int64_t j, const void*& ptr) {
  if (j < qr.n_win) {
    const int64_t pos = qr.lo + j;
    if (pos >= qr.chunk_pos0) {
      ptr = a.chunk_kv + (int64_t(qr.chunk_row0) + (pos - qr.chunk_pos0)) * a.d_head;
      return kF32;
    }
    ptr = kvdev::row_ptr(a.ring, qr.ring_nbytes, qr.seq, pos % a.window);
    return kRing;
  }
  const int32_t g = qr.sel[j - qr.n_win];
  if (g < 0) {
    ptr = nullptr;
    return kSkipped;
  }
  ptr = kvdev::row_ptr(a.comp, qr.comp_nbytes, qr.seq, g);
  return kComp;
}

// Shared memory of one segment: its rows dequantized [kSegRows, d] f32 (row stride ld ≥ d), their stored bytes
// [kSegRows, raw_words] (staged before they are decoded), their kinds and addresses.
struct SegmentTile {
  float* rows;
  int ld;
  uint32_t* raw;
  int raw_words;
  const void** ptrs;
  uint8_t* kinds;
};

// Words of a stored row the raw stage holds: the larger of the two compact formats (rows are padded to
// 4 bytes, kv_pages.h); this step's own f32 rows are copied straight into the dequantized tile.
__host__ __device__ inline int raw_row_words(size_t ring_nbytes, size_t comp_nbytes) {
  return int((ring_nbytes > comp_nbytes ? ring_nbytes : comp_nbytes) / 4);
}

__host__ __device__ inline size_t tile_smem_bytes(int d, int raw_words, int ld = 0) {
  return sizeof(const void*) * kSegRows + sizeof(float) * size_t(kSegRows) * size_t(ld > d ? ld : d) +
         sizeof(uint32_t) * size_t(kSegRows) * size_t(raw_words) + kSegRows;
}

// Carves a SegmentTile out of `smem` (pointers first for their alignment); returns the first byte after it.
__device__ unsigned char* carve_tile(unsigned char* smem, int d, int raw_words, SegmentTile& t, int ld = 0) {
  t.ptrs = reinterpret_cast<const void**>(smem);
  t.rows = reinterpret_cast<float*>(t.ptrs + kSegRows);
  t.ld = ld > d ? ld : d;
  t.raw = reinterpret_cast<uint32_t*>(t.rows + size_t(kSegRows) * t.ld);
  t.raw_words = raw_words;
  t.kinds = reinterpret_cast<uint8_t*>(t.raw + size_t(kSegRows) * raw_words);
  return t.kinds + kSegRows;
}

// A word from global to shared memory without passing through registers (cp.async, sm_80+): every copy of
// the stage is in flight at once and the warp waits once (cp_async_wait_all). Loading the rows into
// registers first let ptxas interleave each row's loads with its stores (a latency per row), and decoding
// straight from global memory waited on each channel's dependent byte loads in turn: ~37 µs per split
// kernel at 1 K context (bench/results/engine_h200.md, session 10).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(smem))),
               "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Stage 1 of load_segment, a warp per row (rows first, first + step, …): stored rows' words into t.raw,
// f32 rows (this step's own, 4·d bytes) straight into t.rows. The caller waits (cp_async_wait_all) and syncs.
__device__ __forceinline__ void stage_rows(const SegmentTile& t, int d, size_t ring_nbytes, size_t comp_nbytes, int first,
                                           int step, int lane) {
  for (int r = first; r < kSegRows; r += step) {
    const RowKind kind = RowKind(t.kinds[r]);
    if (kind == kSkipped) continue;
    const int words = kind == kF32 ? d : int((kind == kRing ? ring_nbytes : comp_nbytes) / 4);
    const uint32_t* src = static_cast<const uint32_t*>(t.ptrs[r]);
    uint32_t* dst = kind == kF32 ? reinterpret_cast<uint32_t*>(t.rows + size_t(r) * t.ld) : t.raw + size_t(r) * t.raw_words;
    for (int w = lane; w < words; w += 32) cp_async4(dst + w, src + w);
  }
}

// One staged row decoded into dst by a warp, lane l taking channels l + 32k (shared-memory reads).
template <int CPL, KvElem E>
__device__ __forceinline__ void dequant_row(const kvdev::RowLayout& l, const uint8_t* row, float* dst, int d,
                                            int lane) {
  float v[CPL];
#pragma unroll
  for (int k = 0; k < CPL; ++k) {
    const int c = lane + 32 * k;
    v[k] = c < d ? kvdev::layout_channel<E>(l, row, c) : 0.f;
  }
#pragma unroll
  for (int k = 0; k < CPL; ++k) {
    const int c = lane + 32 * k;
    if (c < d) dst[c] = v[k];
  }
}

// The rows' kinds and addresses (a thread per row; rows past the query's end are kSkipped).
__device__ __forceinline__ void resolve_segment(const SparseAttnArgs& a, const QueryRows& qr, int64_t seg0, SegmentTile t) {
  for (int r = threadIdx.x; r < kSegRows; r += blockDim.x) {
    const void* ptr = nullptr;
    t.kinds[r] = seg0 + r < qr.n_rows ? resolve_row(a, qr, seg0 + r, ptr) : kSkipped;
    t.ptrs[r] = ptr;
  }
}

// Rows first, first + step, … staged (stage_rows) and decoded into t.rows, a warp per row. Needs the
// resolved kinds; ends with a barrier.
template <int CPL>
__device__ void decode_rows(const SparseAttnArgs& a, const Layouts& layouts, const QueryRows& qr, SegmentTile t, int first,
                            int step) {
  const int d = a.d_head, lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  stage_rows(t, d, qr.ring_nbytes, qr.comp_nbytes, first + step * warp, step * warps, lane);
  cp_async_wait_all();
  __syncthreads();
  for (int r = first + step * warp; r < kSegRows; r += step * warps) {
    const RowKind kind = RowKind(t.kinds[r]);
    if (kind == kSkipped || kind == kF32) continue;  // f32 rows are in place already
    const kvdev::RowLayout l = layout_of(layouts, kind);
    const uint8_t* row = reinterpret_cast<const uint8_t*>(t.raw + size_t(r) * t.raw_words);
    float* dst = t.rows + size_t(r) * t.ld;
    if (l.elem == KvElem::kF32) dequant_row<CPL, KvElem::kF32>(l, row, dst, d, lane);  // an unquantized ring
    else if (l.elem == KvElem::kFp8E4m3) dequant_row<CPL, KvElem::kFp8E4m3>(l, row, dst, d, lane);
    else dequant_row<CPL, KvElem::kFp4E2m1>(l, row, dst, d, lane);
  }
  __syncthreads();
}

// Rows [seg0, seg0 + kSegRows) of the query into the tile: resolve the rows' addresses, stage their stored
// bytes in shared memory (asynchronous copies), then decode them. Starts and ends with a barrier, so the
// tile may be reused in a loop.
template <int CPL>
__device__ void load_segment(const SparseAttnArgs& a, const Layouts& layouts, const QueryRows& qr, int64_t seg0,
                             SegmentTile t) {
  __syncthreads();
  resolve_segment(a, qr, seg0, t);
  __syncthreads();
  decode_rows<CPL>(a, layouts, qr, t, 0, 1);
}

// load_segment for the split kernels, whose blocks of one (query, segment) — a block per head group — form
// a cluster: each block decodes every csize-th row and copies the others from their decoder's shared
// memory (distributed shared memory), so a row is decoded once per segment, not once per head group
// (decoding was most of the split kernels' time: ~22 µs per call at 1 K context, session 10). A launch
// without a cluster is a cluster of one. Needs d % 4 == 0 when the cluster has more than one block.
template <int CPL>
__device__ void load_segment_shared(const SparseAttnArgs& a, const Layouts& layouts, const QueryRows& qr, int64_t seg0,
                                    SegmentTile t) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), csize = int(cluster.num_blocks());
  resolve_segment(a, qr, seg0, t);
  __syncthreads();
  decode_rows<CPL>(a, layouts, qr, t, rank, csize);
  if (csize == 1) return;
  cluster.sync();  // every block's rows are decoded
  const int d4 = a.d_head / 4, lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  constexpr int kVecs = (CPL + 3) / 4;  // float4s of a row per lane (d ≤ 32·CPL)
  for (int r = warp; r < kSegRows; r += warps) {
    const int owner = r % csize;
    if (owner == rank || t.kinds[r] == kSkipped) continue;
    float4* dst = reinterpret_cast<float4*>(t.rows + size_t(r) * t.ld);
    const float4* src = cluster.map_shared_rank(dst, owner);
    float4 v[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k)
      if (lane + 32 * k < d4) v[k] = src[lane + 32 * k];
#pragma unroll
    for (int k = 0; k < kVecs; ++k)
      if (lane + 32 * k < d4) dst[lane + 32 * k] = v[k];
  }
  cluster.sync();  // no block leaves while another still reads its rows; the copies are visible block-wide
}

// q of head h, lane's channels c = lane + 32k.
template <int CPL>
__device__ __forceinline__ void load_q(const float* qh, int d, int lane, float (&q)[CPL]) {
#pragma unroll
  for (int k = 0; k < CPL; ++k) {
    const int c = lane + 32 * k;
    q[k] = c < d ? qh[c] : 0.f;
  }
}

// ℓ of tile rows r0 … r0 + kLogitRows − 1 for the warp's head (every lane gets them): the rows' dot
// products and butterflies are independent, so they are interleaved (one row at a time left each
// warp waiting out a chain of 16 FMAs and 5 shuffles per row). Each row's arithmetic is unchanged.
constexpr int kLogitRows = 4;
template <int CPL>
__device__ __forceinline__ void tile_logits(const SegmentTile& t, int r0, const float (&q)[CPL], int d, int lane,
                                            float scale, float (&out)[kLogitRows]) {
  float acc[kLogitRows];
#pragma unroll
  for (int n = 0; n < kLogitRows; ++n) {
    const float* row = t.rows + size_t(r0 + n) * t.ld;
    acc[n] = 0.f;
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      const int c = lane + 32 * k;
      if (c < d) acc[n] += q[k] * row[c];
    }
  }
  for (int off = 16; off > 0; off /= 2)
#pragma unroll
    for (int n = 0; n < kLogitRows; ++n) acc[n] += __shfl_xor_sync(0xffffffffu, acc[n], off);
#pragma unroll
  for (int n = 0; n < kLogitRows; ++n) out[n] = t.kinds[r0 + n] == kSkipped ? -INFINITY : acc[n] * scale;
}
static_assert(kSegRows % kLogitRows == 0, "a segment is whole groups of logit rows");

// A segment's sums for the warp's head: p(r) gives p_j of tile row r (called for rows that are not
// skipped); sums[k] = Σ p̃_j·c_j[lane + 32k] and den = Σ p_j, in the chunk order of the file's top.
template <int CPL, typename P>
__device__ __forceinline__ void segment_sums(const SegmentTile& t, P p, bool round_p, int d, int lane,
                                             float (&sums)[CPL], float& den) {
#pragma unroll
  for (int k = 0; k < CPL; ++k) sums[k] = 0.f;
  den = 0.f;
  for (int r0 = 0; r0 < kSegRows; r0 += kChunkRows) {
    float acc[CPL];
#pragma unroll
    for (int k = 0; k < CPL; ++k) acc[k] = 0.f;
    float chunk_den = 0.f;
    for (int r = r0; r < r0 + kChunkRows; ++r) {
      if (t.kinds[r] == kSkipped) continue;
      const float pj = p(r);
      chunk_den += pj;
      const float pv = round_p ? kvdev::bf16_round(pj) : pj;
      const float* row = t.rows + size_t(r) * t.ld;
#pragma unroll
      for (int k = 0; k < CPL; ++k) {
        const int c = lane + 32 * k;
        if (c < d) acc[k] += pv * row[c];
      }
    }
#pragma unroll
    for (int k = 0; k < CPL; ++k) sums[k] += acc[k];
    den += chunk_den;
  }
}

// The head group and head of this warp.
struct HeadOfWarp {
  int h;
  bool active;
};

__device__ __forceinline__ HeadOfWarp head_of_warp(const SparseAttnArgs& a) {
  const int warps = int(blockDim.x) / 32;
  HeadOfWarp w;
  w.h = int(blockIdx.x) * warps + int(threadIdx.x) / 32;
  w.active = w.h < a.n_heads;
  return w;
}

// ---------------------------------------------------------------------------------------------------
// One block per (head group, query).

// Shared memory: the segment tile, then the logits [warps, max_rows].
__host__ __device__ inline size_t one_block_smem_bytes(int d, int raw_words, int64_t max_rows, int warps) {
  return tile_smem_bytes(d, raw_words) + 16 + sizeof(float) * size_t(warps) * size_t(max_rows);
}

// Two blocks per SM (≤ 128 registers: a few bytes spill at CPL 16) hide more of the row loads than one.
template <int CPL>
__global__ void __launch_bounds__(kMaxThreads, 2) sparse_attn_kernel(SparseAttnArgs a, Layouts layouts,
                                                                  size_t ring_nbytes, size_t comp_nbytes,
                                                                  int64_t max_rows) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int i = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32, d = a.d_head;
  SegmentTile t;
  unsigned char* after = carve_tile(smem_raw, d, raw_row_words(ring_nbytes, comp_nbytes), t);
  float* logits = reinterpret_cast<float*>(smem_raw + ((after - smem_raw + 15) / 16) * 16) + size_t(warp) * max_rows;

  const QueryRows qr = query_rows(a, i, ring_nbytes, comp_nbytes);
  const HeadOfWarp hw = head_of_warp(a);
  float q[CPL];
  load_q(a.q + (int64_t(i) * a.n_heads + (hw.active ? hw.h : 0)) * d, d, lane, q);

  // Pass 1: logits (−∞ for skipped rows) and their max.
  float m = -INFINITY;
  for (int64_t seg0 = 0; seg0 < qr.n_rows; seg0 += kSegRows) {
    load_segment<CPL>(a, layouts, qr, seg0, t);
    if (!hw.active) continue;
    for (int r0 = 0; r0 < kSegRows && seg0 + r0 < qr.n_rows; r0 += kLogitRows) {
      float l[kLogitRows];
      tile_logits(t, r0, q, d, lane, a.scale, l);
#pragma unroll
      for (int n = 0; n < kLogitRows; ++n) {
        if (seg0 + r0 + n >= qr.n_rows) break;
        if (lane == 0) logits[seg0 + r0 + n] = l[n];
        m = fmaxf(m, l[n]);
      }
    }
  }
  __syncwarp();

  // Pass 2: segment by segment (every warp takes part in the loads; a warp with no head or no rows idles).
  float tot[CPL], tot_den = 0.f;
#pragma unroll
  for (int k = 0; k < CPL; ++k) tot[k] = 0.f;
  const bool sums = hw.active && m != -INFINITY;
  for (int64_t seg0 = 0; seg0 < qr.n_rows; seg0 += kSegRows) {
    load_segment<CPL>(a, layouts, qr, seg0, t);
    if (!sums) continue;
    float seg[CPL], seg_den;
    segment_sums(t, [&](int r) { return expf(logits[seg0 + r] - m); }, a.round_p_bf16, d, lane, seg, seg_den);
#pragma unroll
    for (int k = 0; k < CPL; ++k) tot[k] += seg[k];
    tot_den += seg_den;
  }
  if (!hw.active) return;
  float* out = a.out + (int64_t(i) * a.n_heads + hw.h) * d;
  const float den = tot_den + (sums ? expf(a.sink[hw.h] - m) : 0.f);
#pragma unroll
  for (int k = 0; k < CPL; ++k) {
    const int c = lane + 32 * k;
    if (c < d) out[c] = sums ? tot[k] / den : 0.f;  // no rows: only the sink, the output is zero
  }
}

// ---------------------------------------------------------------------------------------------------
// Split: one block per (head group, query, segment), three launches over the caller's scratch.

struct SplitScratch {
  float* logits;   // [n_q, n_heads, max_rows]
  float* seg_max;  // [n_q, n_heads, n_seg]
  float* seg_den;  // [n_q, n_heads, n_seg]
  float* seg_sum;  // [n_q, n_heads, n_seg, d]
  int n_seg;
  int64_t max_rows;
};

// m of (query, head) qh from its segments' maxima, by a whole warp (every lane gets it): the loads in
// parallel, one per lane (a loop of dependent loads cost ~0.3 µs per segment). max is exact in any order.
__device__ float query_max(const SplitScratch& s, int64_t qh, int n_seg_q, int lane) {
  float m = -INFINITY;
  for (int k = lane; k < n_seg_q; k += 32) m = fmaxf(m, s.seg_max[qh * s.n_seg + k]);
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  return m;
}

// What both split kernels start from: the block's query rows, segment, tile and warp's head; past_end when
// the segment lies past the query's rows (the later launches read only the query's own segments).
struct SplitBlock {
  QueryRows qr;
  int64_t seg0;
  SegmentTile t;
  HeadOfWarp hw;
  bool past_end;
};

__device__ SplitBlock split_block(const SparseAttnArgs& a, unsigned char* smem, size_t ring_nbytes, size_t comp_nbytes) {
  SplitBlock b;
  b.qr = query_rows(a, blockIdx.y, ring_nbytes, comp_nbytes);
  b.seg0 = int64_t(blockIdx.z) * kSegRows;
  b.past_end = b.seg0 >= b.qr.n_rows;
  carve_tile(smem, a.d_head, raw_row_words(ring_nbytes, comp_nbytes), b.t);
  b.hw = head_of_warp(a);
  return b;
}

template <int CPL>
__global__ void __launch_bounds__(kMaxThreads, 1) split_logits_kernel(SparseAttnArgs a, Layouts layouts, SplitScratch s,
                                                                   size_t ring_nbytes, size_t comp_nbytes) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int i = blockIdx.y, seg = blockIdx.z, lane = threadIdx.x % 32, d = a.d_head;
  const SplitBlock b = split_block(a, smem_raw, ring_nbytes, comp_nbytes);
  if (b.past_end) return;
  float q[CPL];
  const int64_t qh = int64_t(i) * a.n_heads + (b.hw.active ? b.hw.h : 0);
  load_q(a.q + qh * d, d, lane, q);
  load_segment_shared<CPL>(a, layouts, b.qr, b.seg0, b.t);
  if (!b.hw.active) return;
  float m = -INFINITY;
  for (int r0 = 0; r0 < kSegRows && b.seg0 + r0 < b.qr.n_rows; r0 += kLogitRows) {
    float l[kLogitRows];
    tile_logits(b.t, r0, q, d, lane, a.scale, l);
#pragma unroll
    for (int n = 0; n < kLogitRows; ++n) {
      if (b.seg0 + r0 + n >= b.qr.n_rows) break;
      if (lane == 0) s.logits[qh * s.max_rows + b.seg0 + r0 + n] = l[n];
      m = fmaxf(m, l[n]);
    }
  }
  if (lane == 0) s.seg_max[qh * s.n_seg + seg] = m;
}

template <int CPL>
__global__ void __launch_bounds__(kMaxThreads, 1) split_sums_kernel(SparseAttnArgs a, Layouts layouts, SplitScratch s,
                                                                 size_t ring_nbytes, size_t comp_nbytes) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int i = blockIdx.y, seg = blockIdx.z, lane = threadIdx.x % 32, d = a.d_head;
  const SplitBlock b = split_block(a, smem_raw, ring_nbytes, comp_nbytes);
  if (b.past_end) return;
  load_segment_shared<CPL>(a, layouts, b.qr, b.seg0, b.t);
  if (!b.hw.active) return;
  const int64_t qh = int64_t(i) * a.n_heads + b.hw.h;
  const float m = query_max(s, qh, segments_of(b.qr.n_rows), lane);
  if (m == -INFINITY) return;  // the combine writes zeros
  // Lane r holds p of the segment's row r (one load for the warp, not one per row in the sums' loop).
  static_assert(kSegRows == 32, "a lane per row of the segment");
  const float* logits = s.logits + qh * s.max_rows + b.seg0;
  const float p_lane = b.seg0 + lane < b.qr.n_rows ? expf(logits[lane] - m) : 0.f;
  float sums[CPL], den;
  segment_sums(b.t, [&](int r) { return __shfl_sync(0xffffffffu, p_lane, r); }, a.round_p_bf16, d, lane, sums, den);
  float* out = s.seg_sum + (qh * s.n_seg + seg) * d;
#pragma unroll
  for (int k = 0; k < CPL; ++k) {
    const int c = lane + 32 * k;
    if (c < d) out[c] = sums[k];
  }
  if (lane == 0) s.seg_den[qh * s.n_seg + seg] = den;
}

__global__ void __launch_bounds__(512) split_combine_kernel(SparseAttnArgs a, SplitScratch s) {
  pdl_enter();
  const int h = blockIdx.x, i = blockIdx.y, tid = threadIdx.x, d = a.d_head;
  const int64_t qh = int64_t(i) * a.n_heads + h;
  const int64_t t = a.q_pos[i];
  const int64_t lo = t - a.window + 1 > 0 ? t - a.window + 1 : 0;
  const int n_seg_q = segments_of(t - lo + 1 + (a.sel ? a.sel_stride : 0));
  const float m = query_max(s, qh, n_seg_q, tid % 32);  // every warp the same
  float* out = a.out + qh * d;
  if (m == -INFINITY) {
    for (int c = tid; c < d; c += blockDim.x) out[c] = 0.f;
    return;
  }
  float tot_den = 0.f;
  for (int k = 0; k < n_seg_q; ++k) tot_den += s.seg_den[qh * s.n_seg + k];
  const float den = tot_den + expf(a.sink[h] - m);
  for (int c = tid; c < d; c += blockDim.x) {
    float tot = 0.f;
    for (int k = 0; k < n_seg_q; ++k) tot += s.seg_sum[(qh * s.n_seg + k) * d + c];
    out[c] = tot / den;
  }
}

// ---------------------------------------------------------------------------------------------------
// Tensor cores (prefill and large batches): one block per (16 or 32 heads, query), the heads being the m16
// tiles of mma.m16n8k16 (bf16 inputs, f32 accumulation). Pass 1: S = Q·Kᵀ per segment (warp w: head tile w / 4,
// rows 8·(w % 4) .. + 7 of the segment, over all of d), logits into shared memory; then each head's max and
// Σ p_j; pass 2: O += P̃·V per segment (warp w: output channels [w·d/8, (w+1)·d/8) of every head). Exact inputs: q is bf16
// (SparseAttnArgs::q_bf16), every stored row value is bf16-representable (e4m3·2^k, e2m1·e4m3, bf16) and p̃ is
// bf16 (round_p_bf16), so each product is exact and only the order of the f32 sums differs from the other paths.

constexpr int kMmaWarps = 8, kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaRowPad = 8;  // f32 tile row stride d + 8: the pass-1 fragment loads are conflict-free
constexpr int kMmaQPad = 4, kMmaPLd = kSegRows / 2 + 4;  // words per row of q and p̃ (bf16 pairs), padded

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

__host__ __device__ inline int64_t mma_logit_ld(int64_t max_rows) { return (max_rows + kSegRows - 1) / kSegRows * kSegRows; }

// Shared memory for blocks of 16·mt heads: the tile (padded rows), q [heads, d/2 + 4] bf16 pairs, logits [heads,
// mma_logit_ld], p̃ [heads, kMmaPLd] bf16 pairs, then each head's max and denominator.
__host__ __device__ inline size_t mma_smem_bytes(int d, int raw_words, int64_t max_rows, int mt) {
  const size_t heads = 16 * size_t(mt), tile = (tile_smem_bytes(d, raw_words, d + kMmaRowPad) + 15) / 16 * 16;
  return tile + 4 * heads * (size_t(d / 2 + kMmaQPad) + size_t(mma_logit_ld(max_rows)) + kMmaPLd + 2);
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
  for (int e = threadIdx.x; e < kHeads * (d / 2); e += blockDim.x) {  // q as bf16 pairs, zero past n_heads
    const int h = e / (d / 2), c = 2 * (e % (d / 2));
    float2 v = make_float2(0.f, 0.f);
    if (h0 + h < a.n_heads) v = *reinterpret_cast<const float2*>(a.q + (int64_t(i) * a.n_heads + h0 + h) * d + c);
    qs[h * q_ld + c / 2] = pack_bf16(v.x, v.y);
  }

  // Pass 1: logits (−∞ for skipped rows and rows past the query's end); warp w: head tile w / 4, rows 8·(w % 4)
  // .. + 7 of the segment, over all of d. load_segment's first barrier orders q.
  for (int64_t seg0 = 0; seg0 < qr.n_rows; seg0 += kSegRows) {
    load_segment<CPL>(a, layouts, qr, seg0, t);
    const int mt = warp / (kSegRows / 8), n0 = 8 * (warp % (kSegRows / 8));
    if (mt >= MT) continue;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    const float* brow = t.rows + size_t(n0 + g) * t.ld + 2 * tg;
    const uint32_t* qa = qs + (16 * mt + g) * q_ld + tg;
    for (int k0 = 0; k0 < d; k0 += 16) {
      const float2 x = *reinterpret_cast<const float2*>(brow + k0), y = *reinterpret_cast<const float2*>(brow + k0 + 8);
      mma_bf16(c, qa[k0 / 2], qa[8 * q_ld + k0 / 2], qa[k0 / 2 + 4], qa[8 * q_ld + k0 / 2 + 4], pack_bf16(x.x, x.y),
               pack_bf16(y.x, y.y));
    }
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
    for (int r = warp; r < kSegRows; r += kMmaWarps)  // a skipped row's p̃ is 0, and 0·(stale bytes) must stay 0
      if (t.kinds[r] == kSkipped)
        for (int c = lane; c < d; c += 32) t.rows[size_t(r) * t.ld + c] = 0.f;
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

// The split path on tensor cores (decode-sized calls with the tensor-core path's inputs): one block per (16 heads,
// query, segment), the blocks of a (query, segment) a cluster sharing the decoded rows (load_segment_shared), then
// split_combine_kernel as for the scalar split. Logits: warp w < 4 the segment's rows 8w .. 8w + 7 (the one-block
// kernel's fragment loop); sums: p̃ from the query's max, O_seg = P̃·V per warp's channels from zero, Σ p in row
// order. The segments meet in the combine in order.

// Shared memory: the tile (padded rows), q [16, d/2 + 4] bf16 pairs, logits [16, kSegRows], p̃ [16, kMmaPLd], each
// head's max.
__host__ __device__ inline size_t split_mma_smem_bytes(int d, int raw_words) {
  const size_t tile = (tile_smem_bytes(d, raw_words, d + kMmaRowPad) + 15) / 16 * 16;
  return tile + 4 * 16 * (size_t(d / 2 + kMmaQPad) + kSegRows + kMmaPLd + 1);
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
  for (int e = threadIdx.x; e < 16 * (d / 2); e += blockDim.x) {  // q as bf16 pairs, zero past n_heads
    const int h = e / (d / 2), c = 2 * (e % (d / 2));
    float2 v = make_float2(0.f, 0.f);
    if (b.h0 + h < a.n_heads) v = *reinterpret_cast<const float2*>(a.q + (int64_t(i) * a.n_heads + b.h0 + h) * d + c);
    b.qs[h * b.q_ld + c / 2] = pack_bf16(v.x, v.y);
  }
  load_segment_shared<CPL>(a, layouts, b.qr, b.seg0, b.t);  // its barriers also publish q
  if (warp < kSegRows / 8) {
    const int n0 = 8 * warp;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    const float* brow = b.t.rows + size_t(n0 + g) * b.t.ld + 2 * tg;
    const uint32_t* qa = b.qs + g * b.q_ld + tg;
    for (int k0 = 0; k0 < d; k0 += 16) {
      const float2 x = *reinterpret_cast<const float2*>(brow + k0), y = *reinterpret_cast<const float2*>(brow + k0 + 8);
      mma_bf16(c, qa[k0 / 2], qa[8 * b.q_ld + k0 / 2], qa[k0 / 2 + 4], qa[8 * b.q_ld + k0 / 2 + 4], pack_bf16(x.x, x.y),
               pack_bf16(y.x, y.y));
    }
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
  for (int r = warp; r < kSegRows; r += kMmaWarps)  // a skipped row's p̃ is 0, and 0·(stale bytes) must stay 0
    if (b.t.kinds[r] == kSkipped)
      for (int c = lane; c < d; c += 32) b.t.rows[size_t(r) * b.t.ld + c] = 0.f;
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
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int ch0 = warp * (d / kMmaWarps);
#pragma unroll
  for (int ks = 0; ks < kSegRows; ks += 16) {
    const uint32_t* pa = b.ps + g * kMmaPLd + ks / 2 + tg;
    const uint32_t a0 = pa[0], a1 = pa[8 * kMmaPLd], a2 = pa[4], a3 = pa[8 * kMmaPLd + 4];
    const float* v = b.t.rows + size_t(ks + 2 * tg) * b.t.ld + ch0 + g;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (j >= nt) break;
      const float* vj = v + 8 * j;
      mma_bf16(acc[j], a0, a1, a2, a3, pack_bf16(vj[0], vj[b.t.ld]), pack_bf16(vj[8 * b.t.ld], vj[9 * b.t.ld]));
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    if (j >= nt) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = g + 8 * (e >> 1), c = ch0 + 8 * j + 2 * tg + (e & 1);
      if (b.h0 + h >= a.n_heads || b.hm[h] == -INFINITY) continue;  // the combine writes zeros
      s.seg_sum[((int64_t(i) * a.n_heads + b.h0 + h) * s.n_seg + seg) * d + c] = acc[j][e];
    }
  }
}

// Channels per lane the kernels are compiled for: the smallest of 4, 8, 16, 32 holding d_head / 32.
int channels_per_lane(int d) {
  int cpl = 4;
  while (32 * cpl < d) cpl *= 2;
  return cpl;
}

// f(std::integral_constant<int, cpl>{}) for the compiled cpl values.
template <typename F>
Status with_channels_per_lane(int cpl, F&& f) {
  switch (cpl) {
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default: return f(std::integral_constant<int, kMaxChannelsPerLane>{});
  }
}

Status set_smem(const void* kernel, size_t smem, const char* name) {
  if (smem <= 48 * 1024) return {};
  // Above the default dynamic limit: opt in (H100/H200 allow 227 KiB per block).
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      e != cudaSuccess)
    return cuda_error(name, e);
  return {};
}

}  // namespace

size_t sparse_attn_split_scratch_floats(int n_q, int n_heads, int d_head, int64_t max_rows) {
  const int64_t qh = int64_t(n_q) * n_heads, n_seg = segments_of(max_rows);
  return size_t(qh * (max_rows + n_seg * (2 + d_head)));
}

bool sparse_attn_uses_split(int n_q, int n_heads) { return int64_t(n_q) * n_heads <= kSparseAttnSplitMaxBlocks; }

Status sparse_attn_cuda(const SparseAttnArgs& a, cudaStream_t stream) {
  if (a.n_q <= 0) return {};
  if (a.d_head <= 0 || a.d_head > 32 * kMaxChannelsPerLane || a.n_heads <= 0 || a.window <= 0)
    return make_error("sparse_attn_cuda: unsupported shape d_head=", a.d_head, " n_heads=", a.n_heads,
                      " window=", a.window);
  if (kv_row_channels(a.ring.fmt) != a.d_head || !kv_format_supported(a.ring.fmt))
    return make_error("sparse_attn_cuda: ring row format does not match d_head=", a.d_head);
  if (a.sel && (kv_row_channels(a.comp.fmt) != a.d_head || !kv_format_supported(a.comp.fmt)))
    return make_error("sparse_attn_cuda: compressed row format does not match d_head=", a.d_head);
  const int64_t max_rows = int64_t(a.window) + (a.sel ? a.sel_stride : 0);
  if (max_rows > kSparseAttnMaxRows)
    return make_error("sparse_attn_cuda: window + sel_stride = ", max_rows, " rows, limit ", kSparseAttnMaxRows);
  if (a.n_q > 65535) return make_error("sparse_attn_cuda: ", a.n_q, " queries exceed one grid dimension (65535)");
  const size_t need = sparse_attn_split_scratch_floats(a.n_q, a.n_heads, a.d_head, max_rows);
  bool split = a.path == SparseAttnPath::kSplit || a.path == SparseAttnPath::kSplitTensorCore;
  if (a.path == SparseAttnPath::kAuto) split = a.scratch && sparse_attn_uses_split(a.n_q, a.n_heads);
  if (split && (!a.scratch || a.scratch_floats < need))
    return make_error("sparse_attn_cuda: the split path needs ", need, " floats of scratch, given ", a.scratch_floats);

  Layouts layouts{};
  layouts.by_kind[kF32] = kvdev::plain_f32_layout(a.d_head);
  layouts.by_kind[kRing] = kvdev::row_layout(a.ring.fmt);
  if (a.sel) layouts.by_kind[kComp] = kvdev::row_layout(a.comp.fmt);
  const size_t ring_nbytes = kv_row_nbytes(a.ring.fmt), comp_nbytes = a.sel ? kv_row_nbytes(a.comp.fmt) : 0;
  const int raw_words = raw_row_words(ring_nbytes, comp_nbytes);
  const int cpl = channels_per_lane(a.d_head);
  int warps = std::min(kMaxHeadsPerBlock, int(a.n_heads));

  // Tensor cores where the inputs are bf16 values and the shape fits (prefill; large batches): 32 heads per block
  // where there are more than 16 and their logits fit, else 16.
  const int mt = a.n_heads > 16 && mma_smem_bytes(a.d_head, raw_words, max_rows, 2) <= kMaxSmem ? 2 : 1;
  const size_t mma_smem = mma_smem_bytes(a.d_head, raw_words, max_rows, mt);
  const bool mma_ok = a.q_bf16 && a.round_p_bf16 && a.d_head % 64 == 0 && mma_smem <= kMaxSmem;
  if (a.path == SparseAttnPath::kTensorCore && !mma_ok)
    return make_error("sparse_attn_cuda: the tensor-core path needs bf16 q and p, d_head % 64 == 0 and ", mma_smem,
                      " bytes of shared memory (", kMaxSmem, " available)");
  if (!split && mma_ok && a.path != SparseAttnPath::kOneBlock) {
    const dim3 grid(unsigned((a.n_heads + 16 * mt - 1) / (16 * mt)), unsigned(a.n_q));
    return with_channels_per_lane(cpl, [&](auto k) -> Status {
      constexpr int CPL = decltype(k)::value;
      auto go = [&](auto kernel) -> Status {
        SPW_TRY(set_smem(reinterpret_cast<const void*>(kernel), mma_smem, "sparse_attn_mma_kernel shared memory"));
        launch(kernel, grid, kMmaThreads, mma_smem, stream, a, layouts, ring_nbytes, comp_nbytes, max_rows);
        if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch sparse_attn_mma_kernel", e);
        return {};
      };
      return mt == 2 ? go(sparse_attn_mma_kernel<CPL, 2>) : go(sparse_attn_mma_kernel<CPL, 1>);
    });
  }
  if (!split) {
    // Fewer heads per block when their logits would not fit (V4's ratio-128 layers at long context).
    while (warps > 1 && one_block_smem_bytes(a.d_head, raw_words, max_rows, warps) > kMaxSmem) warps = (warps + 1) / 2;
    const size_t smem = one_block_smem_bytes(a.d_head, raw_words, max_rows, warps);
    if (smem > kMaxSmem)
      return make_error("sparse_attn_cuda: ", max_rows, " rows of d_head ", a.d_head, " need ", smem,
                        " bytes of shared memory per block");
    const dim3 grid(unsigned((a.n_heads + warps - 1) / warps), unsigned(a.n_q));
    return with_channels_per_lane(cpl, [&](auto k) -> Status {
      const void* kernel = reinterpret_cast<const void*>(sparse_attn_kernel<decltype(k)::value>);
      SPW_TRY(set_smem(kernel, smem, "sparse_attn_kernel shared memory"));
      launch(sparse_attn_kernel<decltype(k)::value>, grid, 32 * warps, smem, stream, a, layouts, ring_nbytes, comp_nbytes,
                                                                                 max_rows);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch sparse_attn_kernel", e);
      return {};
    });
  }

  SplitScratch s;
  s.max_rows = max_rows;
  // The split path on tensor cores under the tensor-core path's conditions (kSplit keeps the scalar kernels).
  const bool split_mma_ok = a.q_bf16 && a.round_p_bf16 && a.d_head % 64 == 0 &&
                            split_mma_smem_bytes(a.d_head, raw_words) <= kMaxSmem;
  if (a.path == SparseAttnPath::kSplitTensorCore && !split_mma_ok)
    return make_error("sparse_attn_cuda: the tensor-core split path needs bf16 q and p and d_head % 64 == 0");
  // Only on request for now: in the engine it moved the V4 golden model's layer 2 (HCA) off the CPU reference in
  // EngineGolden.V4TeacherForcedLayers (77.9 % of values within 2 bf16 ulps, 99.9 % with the scalar split), while
  // every CudaAttnSparse case passes; not yet understood (bench/results/engine_h200.md, session 13).
  const bool split_mma = split_mma_ok && a.path == SparseAttnPath::kSplitTensorCore;
  s.n_seg = segments_of(max_rows);
  const int64_t qh = int64_t(a.n_q) * a.n_heads;
  s.logits = a.scratch;
  s.seg_max = s.logits + qh * max_rows;
  s.seg_den = s.seg_max + qh * s.n_seg;
  s.seg_sum = s.seg_den + qh * s.n_seg;
  if (s.n_seg > 65535) return make_error("sparse_attn_cuda: ", s.n_seg, " segments exceed one grid dimension");
  if (split_mma) {
    const dim3 grid(unsigned((a.n_heads + 15) / 16), unsigned(a.n_q), unsigned(s.n_seg));
    const size_t smem = split_mma_smem_bytes(a.d_head, raw_words);
    return with_channels_per_lane(cpl, [&](auto k) -> Status {
      constexpr int CPL = decltype(k)::value;
      SPW_TRY(set_smem(reinterpret_cast<const void*>(split_logits_mma_kernel<CPL>), smem, "split_logits_mma_kernel shared memory"));
      SPW_TRY(set_smem(reinterpret_cast<const void*>(split_sums_mma_kernel<CPL>), smem, "split_sums_mma_kernel shared memory"));
      unsigned csize = 1;  // the head tiles of a (query, segment) as one cluster, as below
      while (csize < 8 && grid.x % (2 * csize) == 0 && a.d_head % 4 == 0) csize *= 2;
      const dim3 block(kMmaThreads), cluster(csize, 1, 1);
      if (cudaError_t e = launch_clustered(split_logits_mma_kernel<CPL>, grid, block, smem, stream, cluster, a, layouts,
                                           s, ring_nbytes, comp_nbytes);
          e != cudaSuccess)
        return cuda_error("launch split_logits_mma_kernel", e);
      if (cudaError_t e = launch_clustered(split_sums_mma_kernel<CPL>, grid, block, smem, stream, cluster, a, layouts,
                                           s, ring_nbytes, comp_nbytes);
          e != cudaSuccess)
        return cuda_error("launch split_sums_mma_kernel", e);
      launch(split_combine_kernel, dim3(unsigned(a.n_heads), unsigned(a.n_q)), 512, 0, stream, a, s);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch split_combine_kernel", e);
      return {};
    });
  }
  const dim3 grid(unsigned((a.n_heads + warps - 1) / warps), unsigned(a.n_q), unsigned(s.n_seg));
  const size_t smem = tile_smem_bytes(a.d_head, raw_words);
  return with_channels_per_lane(cpl, [&](auto k) -> Status {
    constexpr int CPL = decltype(k)::value;
    SPW_TRY(set_smem(reinterpret_cast<const void*>(split_logits_kernel<CPL>), smem, "split_logits_kernel shared memory"));
    SPW_TRY(set_smem(reinterpret_cast<const void*>(split_sums_kernel<CPL>), smem, "split_sums_kernel shared memory"));
    // The head groups of a (query, segment) as one cluster (load_segment_shared): the largest power of two
    // ≤ 8 dividing the head groups, when rows are whole float4s.
    unsigned csize = 1;
    while (csize < 8 && grid.x % (2 * csize) == 0 && a.d_head % 4 == 0) csize *= 2;
    const dim3 block(unsigned(32 * warps)), cluster(csize, 1, 1);
    if (cudaError_t e = launch_clustered(split_logits_kernel<CPL>, grid, block, smem, stream, cluster, a, layouts, s,
                                         ring_nbytes, comp_nbytes);
        e != cudaSuccess)
      return cuda_error("launch split_logits_kernel", e);
    if (cudaError_t e = launch_clustered(split_sums_kernel<CPL>, grid, block, smem, stream, cluster, a, layouts, s,
                                         ring_nbytes, comp_nbytes);
        e != cudaSuccess)
      return cuda_error("launch split_sums_kernel", e);
    launch(split_combine_kernel, dim3(unsigned(a.n_heads), unsigned(a.n_q)), 512, 0, stream, a, s);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch split_combine_kernel", e);
    return {};
  });
}

}  // namespace spw::cuda
