// A decode step's token draws on the device: the sampler's parameters and uniform per row, and the
// edits the server's sampler makes around its draw (TokenPick in model/model_runner.h: the
// constraint mask, penalties and biases, logprobs), run by cuda/ops/pick_logits.h on the step's logits.
// The edits' inputs and outputs live in one workspace allocated at load (pick_workspace_nbytes), so a
// step allocates nothing: a draw whose shifts do not fit is not a draw the runner may take
// (fits_pick_workspace), and its row returns logits instead.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "base/status.h"
#include "cuda/ops/pick_logits.h"
#include "cuda/ops/sampling.h"
#include "model/model_runner.h"

namespace spw::engine {

// Edits of single logits (repetition penalties, penalties and biases) of all rows of one decode call.
inline constexpr int64_t kPickShiftsPerStep = int64_t(1) << 16;

// The single-logit edits a TokenPick makes: its repeated ids (with a repetition penalty), penalties and biases.
int64_t pick_shifts(const TokenPick& pick);

struct TokenDraw {
  cuda::SampleParams params;  // temperature ≤ 0: greedy
  double u = 0;               // the uniform of the draw
  std::span<const cuda::LogitShift> repeats;            // repetition penalties: delta = the penalty
  std::span<const cuda::LogitShift> penalties, biases;  // ids unique within each of the three
  std::span<const uint64_t> allowed;  // empty: every token; else (vocab + 63) / 64 words
  int top_logprobs = -1;              // −1 .. cuda::kMaxTopLogprobs
  bool edits() const {
    return !repeats.empty() || !penalties.empty() || !biases.empty() || !allowed.empty() || top_logprobs >= 0;
  }
  int64_t shifts() const { return int64_t(repeats.size() + penalties.size() + biases.size()); }
};

// The draws of TokenPicks (model/model_runner.h), with the device-format shifts their spans point into.
class PickDraws {
 public:
  void add(const TokenPick& pick);
  std::span<const TokenDraw> draws() const { return draws_; }

 private:
  std::deque<std::vector<cuda::LogitShift>> shifts_;  // a deque: its elements never move
  std::vector<TokenDraw> draws_;
};

// The workspace for calls of up to max_rows draws over a vocabulary of vocab.
size_t pick_workspace_nbytes(int64_t max_rows, int64_t vocab);

// Whether draws (one call's) fit that workspace: their edits of single logits in total at most kPickShiftsPerStep.
bool fits_pick_workspace(std::span<const TokenDraw> draws);

// One call's edits. Before the draw: masks, the logprobs' log Z and top lists, then the shifts
// (in place on logits [draws.size(), vocab]). After it: the chosen tokens' logprobs.
class PickEdits {
 public:
  PickEdits(void* workspace, size_t nbytes) : ws_(static_cast<char*>(workspace)), nbytes_(nbytes) {}
  // Uploads the draws' inputs (synchronous copies: the step's stream is drained first) and edits logits.
  Status before_draw(float* logits, int64_t vocab, std::span<const TokenDraw> draws, cudaStream_t stream);
  // The logprobs of the drawn tokens (next: device [rows]), copied to the host; rows without
  // logprobs (top_logprobs −1) are left default.
  Status after_draw(const float* logits, const int32_t* next, std::vector<cuda::RowLogprobs>& out,
                    cudaStream_t stream);

 private:
  char* ws_;
  size_t nbytes_;
  int64_t rows_ = 0, vocab_ = 0;
  bool logprobs_ = false;
  int32_t* top_n_ = nullptr;
  int32_t* first_ = nullptr;  // row r's edits: shifts_[first_[r] .. first_[r + 1])
  cuda::LogitShift* shifts_ = nullptr;
  float* saved_ = nullptr;
  cuda::RowLogprobs* out_ = nullptr;
};

}  // namespace spw::engine
