// Shared pieces of the sparse-attention kernels (contract in sparse_attn.h): the rows of a query and their
// segment tiles in shared memory (resolve, stage by cp.async, dequantize, share across a cluster), the split
// path's scratch, and the tensor-core paths' shared-memory sizes and launchers. sparse_attn.cu holds the scalar
// kernels and the dispatch, sparse_attn_mma.cu the tensor-core kernels.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/attn/kv_device.cuh"
#include "cuda/attn/sparse_attn.h"
#include "cuda/launch.h"

namespace spw::cuda::attn {

constexpr int kChunkRows = 8;                    // rows per chunk
constexpr int kSegRows = 4 * kChunkRows;         // rows per segment: also the rows in shared memory at once
constexpr int kMaxChannelsPerLane = 1024 / 32;   // d_head ≤ 1024
// Shared memory of one block (H100/H200 allow 227 KiB with the opt-in).
constexpr size_t kMaxSmem = 227 * 1024;

inline Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

// Kinds of a row-table entry.
enum RowKind : uint8_t { kSkipped = 0, kF32 = 1, kRing = 2, kComp = 3 };

// The three layouts a row can have, indexed by RowKind (kSkipped's entry is unused). vec4: decode stored
// quantized rows four channels per lane step (dequant_row_x4; the default, off with SPILLWAY_ATTN_VEC4=0, where the layouts
// allow it: vec4_layout_ok).
struct Layouts {
  kvdev::RowLayout by_kind[4];
  bool vec4 = false;
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

__device__ inline QueryRows query_rows(const SparseAttnArgs& a, int i, size_t ring_nbytes, size_t comp_nbytes) {
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
__device__ inline RowKind resolve_row(const SparseAttnArgs& a, const QueryRows& qr, int64_t j, const void*& ptr) {
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
__device__ inline unsigned char* carve_tile(unsigned char* smem, int d, int raw_words, SegmentTile& t, int ld = 0) {
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
// kernel at 1 K context (bench/results/engine_h200.md).
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

// Whether dequant_row_x4 takes rows of layout l: fp8 or fp4 codes, four channels never straddling the
// quantized/bf16 boundary or a scale block, 4-byte aligned code words (fp8) or 2-byte ones (fp4).
__host__ __device__ inline bool vec4_layout_ok(const kvdev::RowLayout& l, int d) {
  return (l.elem == KvElem::kFp8E4m3 || l.elem == KvElem::kFp4E2m1) && d % 4 == 0 && l.n_quant % 4 == 0 &&
         l.block_shift >= 2 && l.code_off % 4 == 0;
}

// dequant_row, four consecutive channels per lane step (lane l: channels 4l .. 4l + 3, then + 128): one code
// word and one scale per step instead of per channel, float4 stores. The same values bit for bit: each is
// the same code decode times the same scale (row rows are 4-byte aligned; dst 16-byte aligned, d % 4 == 0).
template <KvElem E>
__device__ __forceinline__ void dequant_row_x4(const kvdev::RowLayout& l, const uint8_t* row, float* dst, int d,
                                               int lane) {
  for (int c = 4 * lane; c < d; c += 128) {
    float4 v;
    if (c >= l.n_quant) {  // bf16 channels, stored first in the row
      const uint32_t* b = reinterpret_cast<const uint32_t*>(row + 2 * (c - l.n_quant));
      const uint32_t lo = b[0], hi = b[1];
      v = make_float4(__uint_as_float(lo << 16), __uint_as_float(lo & 0xffff0000u), __uint_as_float(hi << 16),
                      __uint_as_float(hi & 0xffff0000u));
    } else {
      const uint32_t sc = row[l.scale_off + (c >> l.block_shift)];
      const float s = l.e4m3_scale ? kvdev::e4m3_to_f32(sc) : kvdev::e8m0_to_f32(sc);
      if constexpr (E == KvElem::kFp8E4m3) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(row + l.code_off + c);
        v = make_float4(kvdev::e4m3_to_f32(w & 0xffu) * s, kvdev::e4m3_to_f32((w >> 8) & 0xffu) * s,
                        kvdev::e4m3_to_f32((w >> 16) & 0xffu) * s, kvdev::e4m3_to_f32(w >> 24) * s);
      } else {
        const uint32_t w = *reinterpret_cast<const uint16_t*>(row + l.code_off + (c >> 1));
        v = make_float4(kvdev::e2m1_to_f32(w & 0xfu) * s, kvdev::e2m1_to_f32((w >> 4) & 0xfu) * s,
                        kvdev::e2m1_to_f32((w >> 8) & 0xfu) * s, kvdev::e2m1_to_f32(w >> 12) * s);
      }
    }
    *reinterpret_cast<float4*>(dst + c) = v;
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
    if (layouts.vec4 && l.elem != KvElem::kF32) {
      if (l.elem == KvElem::kFp8E4m3) dequant_row_x4<KvElem::kFp8E4m3>(l, row, dst, d, lane);
      else dequant_row_x4<KvElem::kFp4E2m1>(l, row, dst, d, lane);
      continue;
    }
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
// (decoding was most of the split kernels' time: ~22 µs per call at 1 K context). A launch
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
__device__ inline float query_max(const SplitScratch& s, int64_t qh, int n_seg_q, int lane) {
  float m = -INFINITY;
  for (int k = lane; k < n_seg_q; k += 32) m = fmaxf(m, s.seg_max[qh * s.n_seg + k]);
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  return m;
}

// Channels per lane the kernels are compiled for: the smallest of 4, 8, 16, 32 holding d_head / 32.
inline int channels_per_lane(int d) {
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

inline Status set_smem(const void* kernel, size_t smem, const char* name) {
  if (smem <= 48 * 1024) return {};
  // Above the default dynamic limit: opt in (H100/H200 allow 227 KiB per block).
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      e != cudaSuccess)
    return cuda_error(name, e);
  return {};
}


// The split path's logits and sums kernels over grid (head groups, queries, segments): the head groups of a
// (query, segment) as one cluster (load_segment_shared), the largest power of two ≤ 8 dividing them, when rows are
// whole float4s. `what` names the kernels in errors.
template <class LogitsKernel, class SumsKernel>
Status launch_split_pair(LogitsKernel logits, SumsKernel sums, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         const SparseAttnArgs& a, const Layouts& layouts, const SplitScratch& s, size_t ring_nbytes,
                         size_t comp_nbytes, const char* what) {
  SPW_TRY(set_smem(reinterpret_cast<const void*>(logits), smem, what));
  SPW_TRY(set_smem(reinterpret_cast<const void*>(sums), smem, what));
  unsigned csize = 1;
  while (csize < 8 && grid.x % (2 * csize) == 0 && a.d_head % 4 == 0) csize *= 2;
  const dim3 cluster(csize, 1, 1);
  if (cudaError_t e = launch_clustered(logits, grid, block, smem, stream, cluster, a, layouts, s, ring_nbytes, comp_nbytes);
      e != cudaSuccess)
    return cuda_error(what, e);
  if (cudaError_t e = launch_clustered(sums, grid, block, smem, stream, cluster, a, layouts, s, ring_nbytes, comp_nbytes);
      e != cudaSuccess)
    return cuda_error(what, e);
  return {};
}

// ---------------------------------------------------------------------------------------------------
// The tensor-core paths (sparse_attn_mma.cu).

constexpr int kMmaWarps = 8, kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaRowPad = 8;  // f32 tile row stride d + 8: the pass-1 fragment loads are conflict-free
constexpr int kMmaQPad = 4, kMmaPLd = kSegRows / 2 + 4;  // words per row of q and p̃ (bf16 pairs), padded

__host__ __device__ inline int64_t mma_logit_ld(int64_t max_rows) { return (max_rows + kSegRows - 1) / kSegRows * kSegRows; }

// Shared memory for blocks of 16·mt heads: the tile (padded rows), q [heads, d/2 + 4] bf16 pairs, logits [heads,
// mma_logit_ld], p̃ [heads, kMmaPLd] bf16 pairs, then each head's max and denominator.
__host__ __device__ inline size_t mma_smem_bytes(int d, int raw_words, int64_t max_rows, int mt) {
  const size_t heads = 16 * size_t(mt), tile = (tile_smem_bytes(d, raw_words, d + kMmaRowPad) + 15) / 16 * 16;
  return tile + 4 * heads * (size_t(d / 2 + kMmaQPad) + size_t(mma_logit_ld(max_rows)) + kMmaPLd + 2);
}

// Shared memory: the tile (padded rows), q [16, d/2 + 4] bf16 pairs, logits [16, kSegRows], p̃ [16, kMmaPLd], each
// head's max.
__host__ __device__ inline size_t split_mma_smem_bytes(int d, int raw_words) {
  const size_t tile = (tile_smem_bytes(d, raw_words, d + kMmaRowPad) + 15) / 16 * 16;
  return tile + 4 * 16 * (size_t(d / 2 + kMmaQPad) + kSegRows + kMmaPLd + 1);
}

// The tensor-core path: grid (heads / (16·mt), n_q), smem = mma_smem_bytes(…, mt).
Status launch_attn_mma(const SparseAttnArgs& a, const Layouts& layouts, size_t ring_nbytes, size_t comp_nbytes,
                       int64_t max_rows, int mt, size_t smem, cudaStream_t stream);
// The split path's logits and sums kernels on tensor cores (the caller launches split_combine_kernel).
Status launch_split_attn_mma(const SparseAttnArgs& a, const Layouts& layouts, const SplitScratch& s,
                             size_t ring_nbytes, size_t comp_nbytes, cudaStream_t stream);

}  // namespace spw::cuda::attn
