// The KV compressors' gated pooling on the GPU (specs/deepseek-v4.md §4.4, §5.2; CPU reference
// detail::compressor_push in src/model/compressor.cpp): streams each sequence's projected rows
// (kv_t, s_t) into per-sequence device state and emits the pooled entry of every group of `ratio`
// tokens that completes, one softmax over the group's tokens per channel:
//   plain:   entry_g[ch] = Σ_{t∈g} softmax_t(s_t[ch]) · kv_t[ch]
//   overlap (V4 ratio 4): the first width/2 channels of group g−1's rows and the last width/2
//            channels of group g's rows share one softmax (8 terms; g = 0 has only its own 4).
// Only the pooling: bf16 rounding, the norm, RoPE and the KV quant follow as separate ops.
//
// State (CompressorStates): per sequence slot, [ratio, width] f32 each of kv and score (the rows of
// the group being filled; slot = position mod ratio), plus for overlap the previous complete group.
// compressor_state_reset_cuda sets a slot to the empty state (kv 0, score −∞), as a new sequence.
// A sequence's slot must have seen every position from 0 on (no gaps), as in the CPU model.
//
// compressor_push_cuda takes n_items chunks, each of a distinct slot: item b pushes n_tokens[b]
// tokens at positions pos0[b] ... , rows in_row0[b] ... of kv/score [*, width] f32 (score without
// `ape`; ape [ratio, width] is added as s_t + ape[t mod ratio] when non-null). It writes the entries
// of groups pos0/ratio ... (pos0+n)/ratio − 1 to rows out_row0[b] ... of entries [*, d_out] f32
// (d_out = width/2 with overlap, else width); max_entries_per_item bounds their count. Entries are
// the same whether a sequence's tokens come one at a time or in chunks (each is computed from the
// same values in the same order), and equal the CPU's up to expf vs exp.
// Tests: tests/gpu/test_cuda_attn_compressor.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::cuda {

struct CompressorShape {
  int32_t ratio = 0;
  int32_t width = 0;  // channels of kv and score rows (2·d with overlap)
  bool overlap = false;
  int32_t d_out() const { return overlap ? width / 2 : width; }
};

struct CompressorStates {
  float* kv = nullptr;          // [n_slots, ratio, width]
  float* score = nullptr;       // [n_slots, ratio, width]
  float* prev_kv = nullptr;     // [n_slots, ratio, width], overlap only
  float* prev_score = nullptr;  // [n_slots, ratio, width], overlap only
};

struct CompressorChunks {
  const int32_t* slot = nullptr;      // [n_items]
  const int64_t* pos0 = nullptr;      // [n_items]
  const int32_t* n_tokens = nullptr;  // [n_items]
  const int32_t* in_row0 = nullptr;   // [n_items]
  const int32_t* out_row0 = nullptr;  // [n_items]
};

Status compressor_state_reset_cuda(const CompressorShape& shape, const CompressorStates& st, int32_t slot,
                                   cudaStream_t stream);

Status compressor_push_cuda(const CompressorShape& shape, const CompressorStates& st, const float* kv,
                            const float* score, const float* ape, const CompressorChunks& chunks, int32_t n_items,
                            int32_t max_entries_per_item, float* entries, cudaStream_t stream);

}  // namespace spw::cuda
