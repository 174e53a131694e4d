// Sparse attention with sinks over compact paged KV (contract in sparse_attn.h).
//
// The arithmetic, shared by both paths below so that they give bit-identical results:
//   logits: ℓ_j = (q·c_j)·scale, one warp per row (lanes stride over the channels, xor-shuffle sum),
//           −∞ for skipped rows; m = max_j ℓ_j (exact); p_j = expf(ℓ_j − m);
//   sums:   the rows are cut into segments of kSegRows = 128 by row index, each segment into 16 chunks
//           of kPass2Chunk = 8 rows, chunk w to warp w; a warp sums p̃_j·c_j and p_j over its chunk in row
//           order; a segment's sum is its 16 warp sums added in warp order; the result is the segment
//           sums added in segment order, divided by (Σ segment denominators + expf(sink − m)).
// Which partial sum a row lands in depends on its index only — not on the row count, which grows with
// padding (V4's HCA selections are padded with −1 to the longest sequence of the step), and not on the
// path — so a query's result does not depend on the other queries of the call.
//
// Paths:
//   one block per (head, query), 512 threads (prefill, large batches): phase 0 resolves the query's rows
//     into a row table in shared memory (address, kind), pass 1 computes the logits into shared memory,
//     pass 2 walks the segments;
//   split (decode, n_q·n_heads ≤ kSparseAttnSplitMaxBlocks, with caller scratch): one block per (head,
//     query, segment) in three launches — logits and segment maxima, segment sums, then the combine —
//     because a decode call has 64 (head, query) pairs for 132 SMs and each block's few hundred rows are a
//     dependent chain of loads (selection → page table → row).
// Rows are dequantized on the fly in both passes by kvdev::layout_channel (offsets resolved once per call,
// codes and scales decoded by bit assembly). The generic per-channel decoder (ldexpf, a runtime division
// by the block, format branches) made this kernel instruction-bound: 402 µs per decode call at 1 K
// context, 509 ms per 4096-token prefill call (bench/results/engine_h200.md, session 6).
// Tests: tests/gpu/test_cuda_attn_sparse.cpp.
#include "cuda/attn/sparse_attn.h"

#include <cmath>

#include "cuda/attn/kv_device.cuh"

namespace spw::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChannelsPerLane = 1024 / 32;
constexpr int kPass2Chunk = 8;                    // rows per warp chunk
constexpr int kSegRows = kWarps * kPass2Chunk;    // rows per segment
constexpr int kChannelsPerThread = 1024 / kThreads;  // channels a thread owns in the warp-order sums

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

// Rows [j0, j0 + n) of the query into a row table (threads stride over the rows).
__device__ void resolve_rows(const SparseAttnArgs& a, const QueryRows& qr, int64_t j0, int n, uint8_t* kinds,
                             const void** ptrs) {
  for (int r = threadIdx.x; r < n; r += blockDim.x) {
    const void* ptr = nullptr;
    kinds[r] = resolve_row(a, qr, j0 + r, ptr);
    ptrs[r] = ptr;
  }
}

// q·row over the lane's channels c = lane + 32k (the caller reduces over lanes).
template <KvElem E>
__device__ __forceinline__ float lane_dot(const kvdev::RowLayout& l, const uint8_t* row, const float* q_s, int d, int lane) {
  float acc = 0.f;
  for (int c = lane; c < d; c += 32) acc += q_s[c] * kvdev::layout_channel<E>(l, row, c);
  return acc;
}

// acc[k] += p·row[lane + 32k].
template <KvElem E>
__device__ __forceinline__ void lane_axpy(const kvdev::RowLayout& l, const uint8_t* row, float p, int d, int lane,
                                          float (&acc)[kMaxChannelsPerLane]) {
#pragma unroll
  for (int k = 0; k < kMaxChannelsPerLane; ++k) {
    const int c = lane + k * 32;
    if (c < d) acc[k] += p * kvdev::layout_channel<E>(l, row, c);
  }
}

// ℓ of one row, computed by a whole warp (every lane gets it).
__device__ float row_logit(const Layouts& layouts, RowKind kind, const void* ptr, const float* q_s, int d, int lane,
                          float scale) {
  float acc = 0.f;
  if (kind != kSkipped) {
    const kvdev::RowLayout l = layout_of(layouts, kind);
    const uint8_t* row = static_cast<const uint8_t*>(ptr);
    if (l.elem == KvElem::kF32) acc = lane_dot<KvElem::kF32>(l, row, q_s, d, lane);
    else if (l.elem == KvElem::kFp8E4m3) acc = lane_dot<KvElem::kFp8E4m3>(l, row, q_s, d, lane);
    else acc = lane_dot<KvElem::kFp4E2m1>(l, row, q_s, d, lane);
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return kind != kSkipped ? acc * scale : -INFINITY;
}

// One warp's chunk: table entries [r0, r1) in row order, p_j = p[r]: acc = Σ p̃_j·c_j, den = Σ p_j.
__device__ void chunk_sums(const Layouts& layouts, const uint8_t* kinds, const void* const* ptrs, const float* p, int r0,
                           int r1, bool round_p, int d, int lane, float (&acc)[kMaxChannelsPerLane], float& den) {
#pragma unroll
  for (int k = 0; k < kMaxChannelsPerLane; ++k) acc[k] = 0.f;
  den = 0.f;
  for (int r = r0; r < r1; ++r) {
    const RowKind kind = RowKind(kinds[r]);
    if (kind == kSkipped) continue;
    const float pj = p[r];
    den += pj;
    const float pv = round_p ? kvdev::bf16_round(pj) : pj;
    const kvdev::RowLayout l = layout_of(layouts, kind);
    const uint8_t* row = static_cast<const uint8_t*>(ptrs[r]);
    if (l.elem == KvElem::kF32) lane_axpy<KvElem::kF32>(l, row, pv, d, lane, acc);
    else if (l.elem == KvElem::kFp8E4m3) lane_axpy<KvElem::kFp8E4m3>(l, row, pv, d, lane, acc);
    else lane_axpy<KvElem::kFp4E2m1>(l, row, pv, d, lane, acc);
  }
}

// A segment's sums: the warps' chunk sums added in warp order. Thread t gets channels t + kThreads·k in
// seg[k] and the denominator in seg_den. part: [kWarps, d] + [kWarps] of shared memory. Ends synchronised.
__device__ void segment_sums(const float (&acc)[kMaxChannelsPerLane], float den, float* part, int d, int lane, int warp,
                             float (&seg)[kChannelsPerThread], float& seg_den) {
  float* part_den = part + size_t(kWarps) * d;
#pragma unroll
  for (int k = 0; k < kMaxChannelsPerLane; ++k) {
    const int c = lane + k * 32;
    if (c < d) part[size_t(warp) * d + c] = acc[k];
  }
  if (lane == 0) part_den[warp] = den;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kChannelsPerThread; ++k) {
    const int c = int(threadIdx.x) + k * kThreads;
    float s = 0.f;
    if (c < d)
      for (int w = 0; w < kWarps; ++w) s += part[size_t(w) * d + c];
    seg[k] = s;
  }
  seg_den = 0.f;
  for (int w = 0; w < kWarps; ++w) seg_den += part_den[w];
  __syncthreads();  // part is reused by the next segment
}

// ---------------------------------------------------------------------------------------------------
// One block per (head, query).

// Shared memory: row addresses [max_rows], q [d], reduction scratch [kWarps], partial sums [kWarps, d]
// and denominators [kWarps], logits [max_rows], kinds [max_rows].
__host__ __device__ inline size_t one_block_smem_bytes(int d, int64_t max_rows) {
  return sizeof(float) * (size_t(d) + kWarps + size_t(kWarps) * d + kWarps + size_t(max_rows)) +
         sizeof(const void*) * size_t(max_rows) + size_t(max_rows);
}

__global__ void __launch_bounds__(kThreads) sparse_attn_kernel(SparseAttnArgs a, Layouts layouts, size_t ring_nbytes,
                                                               size_t comp_nbytes, int64_t max_rows) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int h = blockIdx.x, i = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int d = a.d_head;
  // Pointers first (8-byte alignment), then floats, then the kind bytes.
  const void** row_ptrs = reinterpret_cast<const void**>(smem_raw);                 // [max_rows]
  float* q_s = reinterpret_cast<float*>(row_ptrs + max_rows);                        // [d]
  float* red = q_s + d;                                                              // [kWarps]
  float* part = red + kWarps;                                                        // [kWarps, d] + [kWarps]
  float* logits = part + size_t(kWarps) * d + kWarps;                                // [max_rows]
  uint8_t* kinds = reinterpret_cast<uint8_t*>(logits + max_rows);                    // [max_rows]

  const QueryRows qr = query_rows(a, i, ring_nbytes, comp_nbytes);
  const int n_rows = int(qr.n_rows);

  // Phase 0: q and the row table.
  const float* qh = a.q + (int64_t(i) * a.n_heads + h) * d;
  for (int c = tid; c < d; c += kThreads) q_s[c] = qh[c];
  resolve_rows(a, qr, 0, n_rows, kinds, row_ptrs);
  __syncthreads();

  // Pass 1: logits (−∞ for skipped rows) and their max.
  float m = -INFINITY;
  for (int j = warp; j < n_rows; j += kWarps) {
    const float l = row_logit(layouts, RowKind(kinds[j]), row_ptrs[j], q_s, d, lane, a.scale);
    if (lane == 0) logits[j] = l;
    m = fmaxf(m, l);
  }
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w]);

  float* out = a.out + (int64_t(i) * a.n_heads + h) * d;
  if (m == -INFINITY) {  // no rows: only the sink, the output is zero
    for (int c = tid; c < d; c += kThreads) out[c] = 0.f;
    return;
  }
  for (int j = tid; j < n_rows; j += kThreads) logits[j] = expf(logits[j] - m);  // p_j (0 when skipped)
  __syncthreads();

  // Pass 2: segment by segment.
  float tot[kChannelsPerThread] = {}, tot_den = 0.f;
  float acc[kMaxChannelsPerLane];
  for (int seg0 = 0; seg0 < n_rows; seg0 += kSegRows) {
    const int r0 = min(seg0 + warp * kPass2Chunk, n_rows), r1 = min(r0 + kPass2Chunk, n_rows);
    float den;
    chunk_sums(layouts, kinds, row_ptrs, logits, r0, r1, a.round_p_bf16, d, lane, acc, den);
    float seg[kChannelsPerThread], seg_den;
    segment_sums(acc, den, part, d, lane, warp, seg, seg_den);
#pragma unroll
    for (int k = 0; k < kChannelsPerThread; ++k) tot[k] += seg[k];
    tot_den += seg_den;
  }
  const float den = tot_den + expf(a.sink[h] - m);
#pragma unroll
  for (int k = 0; k < kChannelsPerThread; ++k) {
    const int c = tid + k * kThreads;
    if (c < d) out[c] = tot[k] / den;
  }
}

// ---------------------------------------------------------------------------------------------------
// Split: one block per (head, query, segment), three launches over the caller's scratch.

struct SplitScratch {
  float* logits;   // [n_q, n_heads, max_rows]
  float* seg_max;  // [n_q, n_heads, n_seg]
  float* seg_den;  // [n_q, n_heads, n_seg]
  float* seg_sum;  // [n_q, n_heads, n_seg, d]
  int n_seg;
  int64_t max_rows;
};

__device__ int query_segments(int64_t n_rows) { return int((n_rows + kSegRows - 1) / kSegRows); }

__device__ float query_max(const SplitScratch& s, int64_t qh, int n_seg_q) {
  float m = -INFINITY;
  for (int k = 0; k < n_seg_q; ++k) m = fmaxf(m, s.seg_max[qh * s.n_seg + k]);
  return m;
}

// The (head, query, segment) of a split-path block: its query's rows, flat (query, head) index, first row
// and row count (0 when the segment lies past the query's rows: the later launches read only its segments).
struct Segment {
  QueryRows qr;
  int64_t qh, seg0;
  int n;
};

__device__ Segment this_segment(const SparseAttnArgs& a, size_t ring_nbytes, size_t comp_nbytes) {
  Segment g;
  g.qr = query_rows(a, blockIdx.y, ring_nbytes, comp_nbytes);
  g.qh = int64_t(blockIdx.y) * a.n_heads + blockIdx.x;
  g.seg0 = int64_t(blockIdx.z) * kSegRows;
  g.n = g.seg0 < g.qr.n_rows ? int(min(int64_t(kSegRows), g.qr.n_rows - g.seg0)) : 0;
  return g;
}

__global__ void __launch_bounds__(kThreads) split_logits_kernel(SparseAttnArgs a, Layouts layouts, SplitScratch s,
                                                                size_t ring_nbytes, size_t comp_nbytes) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int seg = blockIdx.z, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int d = a.d_head;
  const void** row_ptrs = reinterpret_cast<const void**>(smem_raw);  // [kSegRows]
  float* q_s = reinterpret_cast<float*>(row_ptrs + kSegRows);         // [d]
  float* red = q_s + d;                                                // [kWarps]
  uint8_t* kinds = reinterpret_cast<uint8_t*>(red + kWarps);           // [kSegRows]

  const Segment g = this_segment(a, ring_nbytes, comp_nbytes);
  if (g.n == 0) return;
  const QueryRows& qr = g.qr;
  const int64_t qh = g.qh, seg0 = g.seg0;
  const int n = g.n;
  const float* qv = a.q + qh * d;
  for (int c = tid; c < d; c += kThreads) q_s[c] = qv[c];
  resolve_rows(a, qr, seg0, n, kinds, row_ptrs);
  __syncthreads();

  float m = -INFINITY;
  for (int r = warp; r < n; r += kWarps) {
    const float l = row_logit(layouts, RowKind(kinds[r]), row_ptrs[r], q_s, d, lane, a.scale);
    if (lane == 0) s.logits[qh * s.max_rows + seg0 + r] = l;
    m = fmaxf(m, l);
  }
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (tid == 0) {
    float mm = red[0];
    for (int w = 1; w < kWarps; ++w) mm = fmaxf(mm, red[w]);
    s.seg_max[qh * s.n_seg + seg] = mm;
  }
}

__global__ void __launch_bounds__(kThreads) split_sums_kernel(SparseAttnArgs a, Layouts layouts, SplitScratch s,
                                                              size_t ring_nbytes, size_t comp_nbytes) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int seg = blockIdx.z, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int d = a.d_head;
  const void** row_ptrs = reinterpret_cast<const void**>(smem_raw);  // [kSegRows]
  float* p = reinterpret_cast<float*>(row_ptrs + kSegRows);           // [kSegRows]
  float* part = p + kSegRows;                                          // [kWarps, d] + [kWarps]
  uint8_t* kinds = reinterpret_cast<uint8_t*>(part + size_t(kWarps) * d + kWarps);  // [kSegRows]

  const Segment g = this_segment(a, ring_nbytes, comp_nbytes);
  if (g.n == 0) return;
  const QueryRows& qr = g.qr;
  const int64_t qh = g.qh, seg0 = g.seg0;
  const int n = g.n;
  const float m = query_max(s, qh, query_segments(qr.n_rows));
  if (m == -INFINITY) return;  // the combine writes zeros
  resolve_rows(a, qr, seg0, n, kinds, row_ptrs);
  for (int r = tid; r < n; r += kThreads) p[r] = expf(s.logits[qh * s.max_rows + seg0 + r] - m);
  __syncthreads();

  const int r0 = min(warp * kPass2Chunk, n), r1 = min(r0 + kPass2Chunk, n);
  float acc[kMaxChannelsPerLane], den;
  chunk_sums(layouts, kinds, row_ptrs, p, r0, r1, a.round_p_bf16, d, lane, acc, den);
  float sums[kChannelsPerThread], sum_den;
  segment_sums(acc, den, part, d, lane, warp, sums, sum_den);
  float* out = s.seg_sum + (qh * s.n_seg + seg) * d;
#pragma unroll
  for (int k = 0; k < kChannelsPerThread; ++k) {
    const int c = tid + k * kThreads;
    if (c < d) out[c] = sums[k];
  }
  if (tid == 0) s.seg_den[qh * s.n_seg + seg] = sum_den;
}

__global__ void __launch_bounds__(kThreads) split_combine_kernel(SparseAttnArgs a, SplitScratch s) {
  const int h = blockIdx.x, i = blockIdx.y, tid = threadIdx.x, d = a.d_head;
  const int64_t qh = int64_t(i) * a.n_heads + h;
  const int64_t t = a.q_pos[i];
  const int64_t lo = t - a.window + 1 > 0 ? t - a.window + 1 : 0;
  const int n_seg_q = query_segments(t - lo + 1 + (a.sel ? a.sel_stride : 0));
  const float m = query_max(s, qh, n_seg_q);
  float* out = a.out + qh * d;
  if (m == -INFINITY) {
    for (int c = tid; c < d; c += kThreads) out[c] = 0.f;
    return;
  }
  float tot_den = 0.f;
  for (int k = 0; k < n_seg_q; ++k) tot_den += s.seg_den[qh * s.n_seg + k];
  const float den = tot_den + expf(a.sink[h] - m);
  for (int c = tid; c < d; c += kThreads) {
    float tot = 0.f;
    for (int k = 0; k < n_seg_q; ++k) tot += s.seg_sum[(qh * s.n_seg + k) * d + c];
    out[c] = tot / den;
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
  const int64_t qh = int64_t(n_q) * n_heads, n_seg = (max_rows + kSegRows - 1) / kSegRows;
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
  bool split = a.path == SparseAttnPath::kSplit;
  if (a.path == SparseAttnPath::kAuto) split = a.scratch && sparse_attn_uses_split(a.n_q, a.n_heads);
  if (split && (!a.scratch || a.scratch_floats < need))
    return make_error("sparse_attn_cuda: the split path needs ", need, " floats of scratch, given ", a.scratch_floats);

  Layouts layouts{};
  layouts.by_kind[kF32] = kvdev::plain_f32_layout(a.d_head);
  layouts.by_kind[kRing] = kvdev::row_layout(a.ring.fmt);
  if (a.sel) layouts.by_kind[kComp] = kvdev::row_layout(a.comp.fmt);
  const size_t ring_nbytes = kv_row_nbytes(a.ring.fmt), comp_nbytes = a.sel ? kv_row_nbytes(a.comp.fmt) : 0;

  if (!split) {
    const size_t smem = one_block_smem_bytes(a.d_head, max_rows);
    SPW_TRY(set_smem(reinterpret_cast<const void*>(sparse_attn_kernel), smem, "sparse_attn_kernel shared memory"));
    sparse_attn_kernel<<<dim3(unsigned(a.n_heads), unsigned(a.n_q)), kThreads, smem, stream>>>(
        a, layouts, ring_nbytes, comp_nbytes, max_rows);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch sparse_attn_kernel", e);
    return {};
  }

  SplitScratch s;
  s.max_rows = max_rows;
  s.n_seg = int((max_rows + kSegRows - 1) / kSegRows);
  const int64_t qh = int64_t(a.n_q) * a.n_heads;
  s.logits = a.scratch;
  s.seg_max = s.logits + qh * max_rows;
  s.seg_den = s.seg_max + qh * s.n_seg;
  s.seg_sum = s.seg_den + qh * s.n_seg;
  if (s.n_seg > 65535) return make_error("sparse_attn_cuda: ", s.n_seg, " segments exceed one grid dimension");
  const dim3 grid(unsigned(a.n_heads), unsigned(a.n_q), unsigned(s.n_seg));
  const size_t smem_logits = sizeof(const void*) * kSegRows + sizeof(float) * (size_t(a.d_head) + kWarps) + kSegRows;
  const size_t smem_sums =
      sizeof(const void*) * kSegRows + sizeof(float) * (kSegRows + size_t(kWarps) * a.d_head + kWarps) + kSegRows;
  SPW_TRY(set_smem(reinterpret_cast<const void*>(split_sums_kernel), smem_sums, "split_sums_kernel shared memory"));
  split_logits_kernel<<<grid, kThreads, smem_logits, stream>>>(a, layouts, s, ring_nbytes, comp_nbytes);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch split_logits_kernel", e);
  split_sums_kernel<<<grid, kThreads, smem_sums, stream>>>(a, layouts, s, ring_nbytes, comp_nbytes);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch split_sums_kernel", e);
  split_combine_kernel<<<dim3(unsigned(a.n_heads), unsigned(a.n_q)), kThreads, 0, stream>>>(a, s);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch split_combine_kernel", e);
  return {};
}

}  // namespace spw::cuda
