// Sparse attention with a per-head sink on the GPU (specs/deepseek-v4.md §3, §4.3 step 5, §5.2 step 4;
// CPU reference ref::sparse_attn_sink, composed as in src/model/attention.cpp), reading K = V rows
// straight from the compact paged storage (kv_pages.h) and dequantizing them on the fly.
//
// For query i at position t = q_pos[i] of sequence s = q_seq[i], the rows, in this order, are
//   window: positions max(0, t − window + 1) .. t; a position ≥ chunk_pos0[i] is row
//           chunk_row0[i] + (pos − chunk_pos0[i]) of chunk_kv (this step's new rows, f32, already
//           fake-quantized like the ring), an earlier one is ring row pos mod window of sequence s;
//   compressed: entries sel[i][0 .. sel_stride), −1 entries skipped, from `comp` of sequence s.
// ℓ_j = (q_h·c_j)·scale, m = max_j ℓ_j, p_j = exp(ℓ_j − m),
// o_h = Σ_j p̃_j·c_j / (Σ_j p_j + exp(sink_h − m)), p̃_j = bf16(p_j) if round_p_bf16 else p_j; with no
// rows the output is zero (as the reference).
// Decode = one query per sequence (chunk_pos0 = t, chunk_kv holding the new token's row, or
// chunk_pos0 = t + 1 if the ring already holds it); prefill = many queries of one sequence with
// chunk_pos0 = the chunk's first position. Hazard: the ring rows this call reads must not have been
// overwritten by this step's rows yet (write the ring after attention, as attention.cpp does).
//
// Contract: device pointers. q [n_q, n_heads, d_head] f32, out [n_q, n_heads, d_head] f32
// (overwritten, no aliasing). Logits stay in shared memory: window + sel_stride ≤ kSparseAttnMaxRows.
// Numerics: exact max (two passes), fp32 throughout; p_j·c_j summed in chunks of 8 rows, 4 chunks to
// a segment of 32 rows, segments in order, all by row index (so padding rows change nothing); results
// differ from the CPU only by summation order and expf vs exp, never depend on the other queries of the
// call, and are bit-identical between the two paths (one block per (head, query), or split over
// segments for decode-sized calls when the caller gives scratch). A third path (kTensorCore; kAuto's
// choice for the calls the split path does not take when q_bf16 and round_p_bf16 hold and d_head % 64 == 0)
// multiplies on tensor cores: exact bf16 products, f32 sums in another order (its own results are
// deterministic and per query too; it differs from the others by that order only). kSplitTensorCore runs
// the split path on tensor cores under the same conditions (on request only: see sparse_attn.cu).
// Limits: d_head ≤ 1024 (formats as kv_format_supported), n_heads ≥ 1.
// Tests: tests/gpu/test_cuda_attn_sparse.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "cuda/attn/kv_pages.h"

namespace spw::cuda {

// V4 ratio-128 layers at 1 M context: 8192 entries + 128 window rows; 40 KiB of logits.
constexpr int kSparseAttnMaxRows = 10 * 1024;

// At or below this many (query, head) pairs, kAuto splits each query's rows over blocks (decode: one query
// per sequence, 64 heads, 132 SMs) when scratch is given.
constexpr int kSparseAttnSplitMaxBlocks = 512;

// kSplit: the split path, fused into one cooperative launch when its grid fits on the GPU at once, else three
// launches; kSplitLaunches: always the three launches (tests compare the two).
enum class SparseAttnPath { kAuto, kOneBlock, kSplit, kTensorCore, kSplitTensorCore, kSplitLaunches };

// Process-wide switches for A/B runs (docs/settings.md; the CLI sets them from SPILLWAY_ATTN_*), all on by default:
//   mma = false keeps kAuto off the tensor-core path: the scalar kernels sum in the CPU reference's row order, for
//     A/B checks of the tensor cores' summation against a trained model;
//   vec4 = false decodes stored rows a channel per lane step instead of four (dequant_row_x4; same bits);
//   fused = false keeps the split path's three launches instead of the fused cooperative kernel (same bits).
struct SparseAttnSwitches {
  bool mma = true, vec4 = true, fused = true;
};
void set_sparse_attn_switches(const SparseAttnSwitches& s);

// Floats of scratch the split path needs (max_rows = window + sel_stride).
size_t sparse_attn_split_scratch_floats(int n_q, int n_heads, int d_head, int64_t max_rows);
// Whether kAuto takes the split path for this call (given scratch).
bool sparse_attn_uses_split(int n_q, int n_heads);

struct SparseAttnArgs {
  const float* q = nullptr;     // [n_q, n_heads, d_head]
  const float* sink = nullptr;  // [n_heads]
  int32_t n_q = 0, n_heads = 0, d_head = 0, window = 0;
  float scale = 0.f;            // 1/√d_head in the model
  bool round_p_bf16 = true;
  bool q_bf16 = false;          // q holds bf16 values: with round_p_bf16 and d_head % 64 == 0, kAuto's
                                // non-split calls take the tensor-core path
  // Per query.
  const int32_t* q_seq = nullptr;       // [n_q] sequence (row of the page tables)
  const int64_t* q_pos = nullptr;       // [n_q]
  const int64_t* chunk_pos0 = nullptr;  // [n_q] first position whose row is in chunk_kv
  const int32_t* chunk_row0 = nullptr;  // [n_q] its row in chunk_kv
  const float* chunk_kv = nullptr;      // [*, d_head] f32
  KvPages ring;                         // window ring (logical row = pos mod window)
  const int32_t* sel = nullptr;         // [n_q, sel_stride] compressed entry ids, −1 = none; null if none
  int32_t sel_stride = 0;
  KvPages comp;                         // compressed entries (logical row = entry id)
  float* out = nullptr;                 // [n_q, n_heads, d_head]
  // Device scratch for the split path (sparse_attn_split_scratch_floats); null: one block per (head, query).
  float* scratch = nullptr;
  size_t scratch_floats = 0;
  SparseAttnPath path = SparseAttnPath::kAuto;  // kSplit / kOneBlock force a path (tests)
  // Stored rows decoded four channels per lane step where their formats allow it (bit-identical). On by default:
  // the 4096-token V4.1 prefill's tensor-core attention took 9.96 instead of 17.32 ms per layer call on the H200
  // (docs/settings.md, SPILLWAY_ATTN_VEC4). false, or SparseAttnSwitches::vec4 = false, decodes a channel per
  // lane step (tests, A/B).
  bool decode_x4 = true;
};

Status sparse_attn_cuda(const SparseAttnArgs& a, cudaStream_t stream);

}  // namespace spw::cuda
