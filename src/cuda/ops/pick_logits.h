// The steps around the draw that the server's sampler takes on the host (runtime/sampler.cpp), on the
// device over logits [n_rows, vocab] f32, so a decode step returns a token and its logprobs instead of
// the logits (TokenPick in model/model_runner.h states the pipeline):
//   mask_logits      tokens outside a row's allowed bits → −infinity;
//   top_logprobs     per row, log Z of the masked logits and the n most likely tokens' logprobs;
//   shift_logits     repetition penalties (a positive logit divided by the penalty, any other multiplied),
//                    then penalties, then biases, added to the row's logits (each pass's ids unique), the
//                    value before each edit kept so chosen_logprobs can see the unedited logit;
//   (argmax or sample draws from the shifted logits)
//   chosen_logprobs  the drawn token's logprob under the masked logits.
// Numbers: log Z = max + log Σ exp(l − max) in f64 as on the host (only the summation order differs);
// logprobs are float(double(l) − log Z). Top lists run in (logit descending, id ascending) order and stop
// at the first non-finite logit, as on the host.
// Contract: device pointers; rows are independent; a per-row index of −1 means "none for this row".
// Tests: tests/gpu/test_cuda_ops_pick.cpp (against runtime::Sampler).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace spw::cuda {

struct LogitShift {
  int32_t id;
  float delta;
};

inline constexpr int kMaxTopLogprobs = 20;

// A row's logprobs: log Z, the chosen token's logprob, and the n_top most likely.
struct RowLogprobs {
  double log_z;
  float chosen;
  int32_t n_top;
  int32_t top_ids[kMaxTopLogprobs];
  float top_logprobs[kMaxTopLogprobs];
};

// mask_row[r]: the first word of row r's mask in bits ((vocab + 63) / 64 words), or −1 for no mask.
Status mask_logits(float* logits, int64_t n_rows, int64_t vocab, const uint64_t* bits, const int64_t* mask_row,
                   cudaStream_t stream);

// top_n[r] in −1 .. kMaxTopLogprobs: −1 skips the row; else out[r].log_z and out[r].top (n_top ≤ top_n).
Status top_logprobs(const float* logits, int64_t n_rows, int64_t vocab, const int32_t* top_n, RowLogprobs* out,
                    cudaStream_t stream);

// Row r's edits are shifts[first[r] .. repeat_end[r]) (repetition penalties: delta is the penalty), then
// [repeat_end[r] .. split[r]) (penalties, added) and [split[r] .. first[r + 1]) (biases, added); ids outside
// [0, vocab) are skipped. saved[j]: the logit edit j found.
Status shift_logits(float* logits, int64_t n_rows, int64_t vocab, const LogitShift* shifts, const int32_t* first,
                    const int32_t* repeat_end, const int32_t* split, float* saved, cudaStream_t stream);

// out[r].chosen for rows with top_n[r] ≥ 0: the logprob of chosen[r] from its unedited logit (the first
// edit of that id's saved value, else logits) and out[r].log_z.
Status chosen_logprobs(const float* logits, int64_t n_rows, int64_t vocab, const int32_t* chosen,
                       const int32_t* top_n, const LogitShift* shifts, const int32_t* first, const float* saved,
                       RowLogprobs* out, cudaStream_t stream);

}  // namespace spw::cuda
