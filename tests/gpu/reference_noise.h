// The CPU reference against itself under last-bit noise: how far a run of the reference numerics moves
// when a few stream values are off by one bf16 ulp. In reference numerics (bf16 activations, FP8 fake
// quant) a one-ulp change can flip a rounding or quant step and grow from there, so an engine that adds
// in another order (every GPU kernel) cannot be held closer to the CPU than this floor.
// Used by test_engine_demo.cpp (its bounds) and test_engine_diag.cpp (the printed floors).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/model.h"

namespace spw::gpu_test {

inline int argmax_row(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

// ±1 bf16 ulp on a random `share` of the values.
inline void perturb(std::vector<float>& x, double share, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (float& v : x) {
    if (v == 0.f || !std::isfinite(v) || u(rng) >= share) continue;
    uint32_t bits = std::bit_cast<uint32_t>(v);
    bits = u(rng) < 0.5 ? bits + 0x10000u : bits - 0x10000u;  // one bf16 ulp up or down in magnitude
    v = std::bit_cast<float>(bits);
  }
}

struct FreeRun {
  std::vector<float> logits;  // prefill rows, then one row per decode step
  std::vector<int32_t> picks;
};

// Prompt (all logits) then 8 decode steps fed `feed` (or the run's own greedy picks when empty).
// share > 0: that share of the streams ±1 bf16 ulp before every layer of every call; share < 0: one
// value (picked by the seed) +1 bf16 ulp before layer 0 of the prompt only.
inline FreeRun free_run(const Model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& feed,
                        double share, uint32_t seed) {
  FreeRun r;
  std::mt19937 rng(seed);
  SequenceState s = m.new_sequence();
  ForwardOptions o;
  o.all_logits = true;
  bool single_done = false;
  if (share > 0) o.before_layer = [&](int, std::vector<float>& x) { perturb(x, share, rng); };
  if (share < 0)
    o.before_layer = [&](int, std::vector<float>& x) {
      if (single_done) return;
      single_done = true;
      float& v = x[(size_t(seed) * 104729u) % x.size()];
      v = std::bit_cast<float>(std::bit_cast<uint32_t>(v) + 0x10000u);
    };
  const int vocab = int(m.config().vocab_size);
  std::vector<int32_t> step = prompt;
  for (int it = 0; it < 9; ++it) {
    auto out = m.forward(s, step, o);
    EXPECT_TRUE(out.ok()) << out.error().message;
    if (!out.ok()) return r;
    r.logits.insert(r.logits.end(), out->begin(), out->end());
    const int pick = argmax_row(out->data() + out->size() - vocab, vocab);
    r.picks.push_back(pick);
    step = {feed.empty() ? pick : feed[it]};
  }
  return r;
}

// Top-1 agreement and |Δlogit| of two runs' logits (same rows).
struct LogitGap {
  int top1_equal = 0, n_rows = 0;
  double max_abs = 0, mean_abs = 0;
};
inline LogitGap logit_gap(const std::vector<float>& a, const std::vector<float>& b, int vocab) {
  LogitGap g;
  EXPECT_EQ(a.size(), b.size());
  const size_t rows = std::min(a.size(), b.size()) / size_t(vocab);
  for (size_t row = 0; row < rows; ++row) {
    const float* x = a.data() + row * vocab;
    const float* y = b.data() + row * vocab;
    g.top1_equal += argmax_row(x, vocab) == argmax_row(y, vocab);
    for (int v = 0; v < vocab; ++v) {
      const double d = std::fabs(double(x[v]) - y[v]);
      g.max_abs = std::max(g.max_abs, d);
      g.mean_abs += d;
    }
  }
  g.n_rows = int(rows);
  if (rows) g.mean_abs /= double(rows) * vocab;
  return g;
}

// The worst of `seeds` runs with ±1 bf16 ulp on `share` of the streams before every layer against the
// clean run `base` (fed the same tokens): the fewest top-1 agreements, the largest max and mean |Δlogit|.
inline LogitGap noise_floor(const Model& m, const std::vector<int32_t>& prompt, const FreeRun& base, double share,
                            const std::vector<uint32_t>& seeds) {
  LogitGap worst;
  worst.top1_equal = INT32_MAX;
  const int vocab = int(m.config().vocab_size);
  for (uint32_t seed : seeds) {
    const LogitGap g = logit_gap(base.logits, free_run(m, prompt, base.picks, share, seed).logits, vocab);
    worst.n_rows = g.n_rows;
    worst.top1_equal = std::min(worst.top1_equal, g.top1_equal);
    worst.max_abs = std::max(worst.max_abs, g.max_abs);
    worst.mean_abs = std::max(worst.mean_abs, g.mean_abs);
  }
  return worst;
}

}  // namespace spw::gpu_test
