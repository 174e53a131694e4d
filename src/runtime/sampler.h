// Per-request token sampler: penalties and logit_bias → temperature → top-k → min-p → top-p → draw.
// Deterministic for a given seed: its own RNG (splitmix-seeded mt19937_64), ties broken by the
// lower token id, and no dependence on other requests in the batch.
// Logprobs are reported from the model's own distribution (log-softmax of the raw logits), as
// vLLM does by default, so they do not move with temperature or penalties. With a constraint, the
// raw logits are masked first: draws and logprobs both come from the masked distribution, and
// masked tokens never appear among the top logprobs.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <memory>
#include <unordered_map>
#include <vector>

#include "model/model_runner.h"
#include "runtime/request.h"

namespace spw::runtime {

// The model's logprob of `id` under logits [vocab] (log-softmax), with the top_n most likely.
GeneratedToken score_token(std::span<const float> logits, int32_t id, int top_n);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params, std::shared_ptr<LogitsConstraint> constraint = nullptr);

  // Picks the next token from logits [vocab]. Records it for the penalties.
  GeneratedToken sample(std::span<const float> logits);

  // Whether a model runner may pick this request's tokens itself (TokenPick): nothing here needs the
  // logits on the host (no penalties, logit_bias, constraint or logprobs).
  bool runner_may_pick() const;
  // The runner's pick of the next token: the parameters, and the uniform sample() would draw (drawn
  // now from this sampler's generator, so the sequence of draws is the same on either path).
  TokenPick next_pick();
  // Records the token a runner picked with next_pick()'s parameters.
  GeneratedToken accept(int32_t id);
  // sample() with next_pick()'s draw, for a runner that returned the logits after all.
  GeneratedToken sample(std::span<const float> logits, const TokenPick& pick);

 private:
  // The pipeline on logits [vocab]; u is the uniform for the draw (unused when greedy).
  int32_t draw(std::span<const float> logits, double u);

  SamplingParams params_;
  std::shared_ptr<LogitsConstraint> constraint_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> counts_;  // generated token → times generated
  std::vector<float> work_;
  std::vector<int32_t> order_;
  std::vector<float> masked_;
};

}  // namespace spw::runtime
