// Sparse attention with sinks over compact paged KV (contract in sparse_attn.h).
//
// One block of 512 threads (16 warps) per (head, query). The work of a block is a few hundred rows
// whose addresses come from a dependent chain (selection → page table → row), so the kernel is
// latency-bound unless many rows are in flight:
//   phase 0: every thread resolves rows tid, tid + 512, ... into a row table in shared memory (the
//            address and whether the row is f32, a stored row, or skipped), once per block;
//   pass 1:  warps take rows j = warp, warp + 16, ...; lanes stride over the channels (q in shared
//            memory) and reduce the dot product with shuffles; the logits stay in shared memory; the
//            exact max over them is a block reduction; then p_j = exp(ℓ_j − m) once per row;
//   pass 2:  rows go to warps in chunks of kPass2Chunk: chunk q to warp q mod 16; each lane owns the
//            channels lane, lane + 32, ...; a warp accumulates p̃_j·c_j and Σ p_j over its chunks in
//            row order; the 16 partial sums are then added in warp order (shared memory) and divided
//            by Σ p + exp(sink − m).
// Which warp sums a row depends on the row's index only — not on the row count, which grows with
// padding (V4's HCA selections are padded with −1 to the longest sequence of the step) — so a query's
// result does not depend on the other queries of the call; it differs from the reference's single
// running sum by f32 rounding only. The first version (one 128-thread block walking every row serially in pass 2)
// took 1.4 ms per decode call at 1 K context on the H200 (bench/results/engine_h200.md, session 5).
// Rows are dequantized on the fly in both passes (read twice; the second read mostly hits L2), by
// kvdev::layout_channel: offsets resolved once per call (RowLayout), codes and scales decoded by bit
// assembly. The generic per-channel decoder (ldexpf, a runtime division by the block, format branches)
// made this kernel instruction-bound: 402 µs per decode call at 1 K context (engine_h200.md, session 6).
// Tests: tests/gpu/test_cuda_attn_sparse.cpp.
#include "cuda/attn/sparse_attn.h"

#include <cmath>

#include "cuda/attn/kv_device.cuh"

namespace spw::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChannelsPerLane = 1024 / 32;
constexpr int kPass2Chunk = 8;  // rows per chunk of pass 2 (chunk q goes to warp q mod kWarps)

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

// Kinds of a row-table entry.
enum RowKind : uint8_t { kSkipped = 0, kF32 = 1, kRing = 2, kComp = 3 };

struct QueryRows {
  int32_t seq;
  int64_t lo, n_win, chunk_pos0;
  int32_t chunk_row0;
  const int32_t* sel;
  size_t ring_nbytes, comp_nbytes;
};

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

// The three layouts a row can have, indexed by RowKind (kSkipped's entry is unused).
struct Layouts {
  kvdev::RowLayout by_kind[4];
};

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

// Shared memory of one block: q [d], reduction scratch, partial sums [kWarps, d] and denominators
// [kWarps], logits [n_rows], row addresses [n_rows] and kinds [n_rows]; see smem_bytes().
__host__ __device__ inline size_t smem_bytes(int d, int64_t max_rows) {
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
  float* part = red + kWarps;                                                        // [kWarps, d]
  float* part_den = part + size_t(kWarps) * d;                                       // [kWarps]
  float* logits = part_den + kWarps;                                                 // [max_rows]
  uint8_t* kinds = reinterpret_cast<uint8_t*>(logits + max_rows);                    // [max_rows]

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
  const int64_t n_rows = qr.n_win + (a.sel ? a.sel_stride : 0);

  // Phase 0: q and the row table.
  const float* qh = a.q + (int64_t(i) * a.n_heads + h) * d;
  for (int c = tid; c < d; c += kThreads) q_s[c] = qh[c];
  for (int64_t j = tid; j < n_rows; j += kThreads) {
    const void* ptr = nullptr;
    kinds[j] = resolve_row(a, qr, j, ptr);
    row_ptrs[j] = ptr;
  }
  __syncthreads();

  // Pass 1: logits (−∞ for skipped rows) and their max.
  float m = -INFINITY;
  for (int64_t j = warp; j < n_rows; j += kWarps) {
    const RowKind kind = RowKind(kinds[j]);
    const void* ptr = row_ptrs[j];
    float acc = 0.f;
    if (kind != kSkipped) {
      const kvdev::RowLayout& l = layouts.by_kind[kind];
      const uint8_t* row = static_cast<const uint8_t*>(ptr);
      if (l.elem == KvElem::kF32) acc = lane_dot<KvElem::kF32>(l, row, q_s, d, lane);
      else if (l.elem == KvElem::kFp8E4m3) acc = lane_dot<KvElem::kFp8E4m3>(l, row, q_s, d, lane);
      else acc = lane_dot<KvElem::kFp4E2m1>(l, row, q_s, d, lane);
    }
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    const float l = kind != kSkipped ? acc * a.scale : -INFINITY;
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
  for (int64_t j = tid; j < n_rows; j += kThreads) logits[j] = expf(logits[j] - m);  // p_j (0 when skipped)
  __syncthreads();

  // Pass 2: warp w sums its chunks (w, w + 16, ... of kPass2Chunk rows) in row order; lanes own channels lane + 32·k.
  float acc[kMaxChannelsPerLane];
#pragma unroll
  for (int k = 0; k < kMaxChannelsPerLane; ++k) acc[k] = 0.f;
  float denom = 0.f;
  for (int64_t c0 = int64_t(warp) * kPass2Chunk; c0 < n_rows; c0 += int64_t(kWarps) * kPass2Chunk) {
    const int64_t c1 = c0 + kPass2Chunk < n_rows ? c0 + kPass2Chunk : n_rows;
    for (int64_t j = c0; j < c1; ++j) {
      const RowKind kind = RowKind(kinds[j]);
      if (kind == kSkipped) continue;
      const void* ptr = row_ptrs[j];
      const float p = logits[j];
      denom += p;
      const float pv = a.round_p_bf16 ? kvdev::bf16_round(p) : p;
      const kvdev::RowLayout& l = layouts.by_kind[kind];
      const uint8_t* row = static_cast<const uint8_t*>(ptr);
      if (l.elem == KvElem::kF32) lane_axpy<KvElem::kF32>(l, row, pv, d, lane, acc);
      else if (l.elem == KvElem::kFp8E4m3) lane_axpy<KvElem::kFp8E4m3>(l, row, pv, d, lane, acc);
      else lane_axpy<KvElem::kFp4E2m1>(l, row, pv, d, lane, acc);
    }
  }
#pragma unroll
  for (int k = 0; k < kMaxChannelsPerLane; ++k) {
    const int c = lane + k * 32;
    if (c < d) part[size_t(warp) * d + c] = acc[k];
  }
  if (lane == 0) part_den[warp] = denom;
  __syncthreads();

  // o = Σ_w part_w / (Σ_w den_w + exp(sink − m)), warps in order.
  float den = 0.f;
  for (int w = 0; w < kWarps; ++w) den += part_den[w];
  den += expf(a.sink[h] - m);
  for (int c = tid; c < d; c += kThreads) {
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) o += part[size_t(w) * d + c];
    out[c] = o / den;
  }
}

}  // namespace

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
  const size_t smem = smem_bytes(a.d_head, max_rows);
  if (smem > 48 * 1024) {  // above the default dynamic limit: opt in (H100/H200 allow 227 KiB per block)
    if (cudaError_t e = cudaFuncSetAttribute(sparse_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(smem));
        e != cudaSuccess)
      return cuda_error("sparse_attn_kernel shared memory", e);
  }
  if (a.n_q > 65535) return make_error("sparse_attn_cuda: ", a.n_q, " queries exceed one grid dimension (65535)");
  const dim3 grid(unsigned(a.n_heads), unsigned(a.n_q));
  Layouts layouts{};
  layouts.by_kind[kF32] = kvdev::plain_f32_layout(a.d_head);
  layouts.by_kind[kRing] = kvdev::row_layout(a.ring.fmt);
  if (a.sel) layouts.by_kind[kComp] = kvdev::row_layout(a.comp.fmt);
  sparse_attn_kernel<<<grid, kThreads, smem, stream>>>(a, layouts, kv_row_nbytes(a.ring.fmt),
                                                       a.sel ? kv_row_nbytes(a.comp.fmt) : 0, max_rows);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch sparse_attn_kernel", e);
  return {};
}

}  // namespace spw::cuda
