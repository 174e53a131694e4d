// The Lightning Indexer's scoring and selection on the GPU (specs/deepseek-v4.md §4.5, §5.2; CPU
// reference src/model/indexer.cpp: index_scores, select_top, select_candidate_blocks), over index
// keys in the compact paged storage (kv_pages.h, kv_format_index_key: fp4 e2m1, ue8m0 per 32).
//
// A step of an index source layer runs, per query:
//   index_scores_cuda                 score(g) = Σ_h relu(q_h·k_g)·w_h, −∞ for g ≥ visible
//   [V4.1 candidate source] candidate_block_scores_cuda → topk_select_cuda (k = candidate_topk_blocks)
//                                     → candidate_mask_cuda   (the per-entry mask, published)
//   [V4.1 re-index layer]   index_scores_apply_mask_cuda      (−∞ outside the mask)
//   topk_select_cuda (k = index_topk) → entry ids ascending, −1 padded: the attention's `sel`.
//
// Numerics: index_scores_cuda reproduces index_scores bit for bit: the same summation order and
// separately rounded products and sums (__fmul_rn/__fadd_rn; the CPU build has no FMA
// contraction), bf16 rounding of each dot, each weighted term and the sum when round_bf16 (the
// reference computes in bf16). topk_select_cuda orders by (value desc, index asc) like
// ref::topk_indices (−0 == +0), then drops the −∞ picks and returns the rest ascending by index.
//
// Contract: device pointers; per query i, n_entries[i] ≤ score_stride scores are written (others
// untouched); q [n_q, n_heads, d_index] f32 (already fake-quantized), w [n_q, n_heads] f32.
// Limits: d_index ≤ 128 (the key row format as kv_format_supported), n_heads ≤ 64; top-k k ≤ out_stride.
// Tests: tests/gpu/test_cuda_attn_indexer.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/attn/kv_pages.h"

namespace spw::cuda {

struct IndexScoreArgs {
  const float* q = nullptr;          // [n_q, n_heads, d_index]
  const float* w = nullptr;          // [n_q, n_heads]
  int32_t n_q = 0, n_heads = 0, d_index = 0;
  const int32_t* q_seq = nullptr;    // [n_q] sequence (row of the key page tables)
  const int64_t* n_entries = nullptr;  // [n_q] entries scored (compress_len of the step)
  const int64_t* visible = nullptr;    // [n_q] entries g ≥ visible score −∞
  int64_t max_entries = 0;           // ≥ every n_entries[i] (grid size)
  KvPages keys;                      // logical row = entry id
  bool round_bf16 = true;
  float* scores = nullptr;           // [n_q, score_stride]
  int64_t score_stride = 0;
  // Rounds of 4 entries per block (1..8; 0 = by launch size: 8 for prefill chunks, fewer where the grid would not
  // fill the GPU, 1 for decode steps). A block stages its query's q once per block; the scores are the same.
  int rounds = 0;
};

Status index_scores_cuda(const IndexScoreArgs& a, cudaStream_t stream);

// Per row i: the top-min(k, n[i]) of values[i][0 .. n[i]) by (value desc, index asc), −∞ picks
// dropped, written ascending to out[i][0 ..), then −1 up to out_stride.
Status topk_select_cuda(const float* values, int64_t stride, const int64_t* n, int32_t n_rows, int32_t k,
                        int32_t* out, int32_t out_stride, cudaStream_t stream);

// select_candidate_blocks, step 1: block_scores[i][b] = max of scores[i][b·block_size ..] over
// b < n_blocks[i] = ceil(n_entries[i] / block_size) (written to n_blocks), and +∞ for the block
// holding entry visible[i] − 1 when visible[i] ≥ 1.
Status candidate_block_scores_cuda(const float* scores, int64_t score_stride, const int64_t* n_entries,
                                   const int64_t* visible, int32_t n_q, int64_t max_entries, int32_t block_size,
                                   float* block_scores, int64_t block_stride, int64_t* n_blocks,
                                   cudaStream_t stream);

// Step 3: mask[i][g] = 1 iff block g/block_size is among kept[i] (ascending, −1 padded, from
// topk_select_cuda), for g < n_entries[i].
Status candidate_mask_cuda(const int32_t* kept, int32_t kept_stride, const int64_t* n_entries, int32_t n_q,
                           int64_t max_entries, int32_t block_size, uint8_t* mask, int64_t mask_stride,
                           cudaStream_t stream);

// scores[i][g] = −∞ where mask[i][g] == 0, g < n_entries[i] (V4.1 re-index layers).
Status index_scores_apply_mask_cuda(float* scores, int64_t score_stride, const int64_t* n_entries, int32_t n_q,
                                    int64_t max_entries, const uint8_t* mask, int64_t mask_stride,
                                    cudaStream_t stream);

}  // namespace spw::cuda
