// Per-request token sampler: constraint mask → repetition penalty → presence/frequency penalties and
// logit_bias → temperature → top-k → min-p → top-p → draw (TokenPick in model/model_runner.h states the pipeline a runner reproduces).
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
#include <unordered_set>
#include <vector>

#include "model/model_runner.h"
#include "runtime/request.h"

namespace spw::runtime {

// The model's logprob of `id` under logits [vocab] (log-softmax), with the top_n most likely.
GeneratedToken score_token(std::span<const float> logits, int32_t id, int top_n);

class Sampler {
 public:
  // Duplicate logit_bias ids are summed, in order, into one bias each. prompt: the tokens the
  // repetition penalty counts as seen before the first generated one.
  explicit Sampler(const SamplingParams& params, std::shared_ptr<LogitsConstraint> constraint = nullptr,
                   std::span<const int32_t> prompt = {});

  // Picks the next token from logits [vocab]: sample(logits, next_pick(vocab)).
  GeneratedToken sample(std::span<const float> logits);

  // Whether a model runner may pick this request's tokens itself (TokenPick): false only for more
  // top_logprobs than a pick reports. (A runner may still return logits for any pick.)
  bool runner_may_pick() const;
  // The next token's pick: the whole pipeline's inputs (the penalties of the tokens generated so far,
  // the biases, the constraint's allowed tokens, top_logprobs) and the uniform the draw uses (drawn
  // now from this sampler's generator, only when temperature > 0, so the sequence of draws is the
  // same on either path). vocab sizes the allowed-token mask.
  TokenPick next_pick(int64_t vocab);
  // Records the token a runner picked for next_pick()'s pick, with the logprobs it reported.
  GeneratedToken accept(const TokenPick& picked);
  // The pick drawn on the host from logits [vocab], for a runner that returned the logits instead.
  GeneratedToken sample(std::span<const float> logits, const TokenPick& pick);

  // Speculative decoding's acceptance step for one position, given the model's logits [vocab] there and
  // the token a drafter proposed with all its mass (prompt lookup): the draft is accepted with
  // probability p(draft) under this position's pick (next_pick: the whole pipeline; at temperature ≤ 0
  // p is 1 for the argmax and 0 elsewhere), drawn with a uniform of its own. Rejected, the token is drawn
  // from p with the draft removed (renormalized) with the pick's uniform. Either way the token is
  // recorded as sample() records it, so the emitted tokens are distributed exactly as sampling them one
  // by one would be (Leviathan et al. 2023, with a one-hot draft distribution).
  struct Verdict {
    GeneratedToken token;
    bool accepted = false;
  };
  Verdict verify(std::span<const float> logits, int32_t draft);

 private:
  // Records id: the penalties' counts and the constraint's state.
  void record(int32_t id);
  // The pipeline after the mask on logits [vocab] up to the draw: the candidates order_[0..n) (the
  // returned n) with unnormalized probabilities probs_[0..n) that add to `sum`; greedy: the argmax alone.
  size_t distribution(std::span<const float> logits, const TokenPick& pick, double& sum);
  // distribution(), then the draw with the pick's uniform.
  int32_t draw(std::span<const float> logits, const TokenPick& pick);

  SamplingParams params_;
  std::shared_ptr<LogitsConstraint> constraint_;
  std::vector<LogitShift> biases_;  // logit_bias with unique ids
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> counts_;  // generated token → times generated
  std::unordered_set<int32_t> seen_;          // prompt and generated tokens (repetition penalty only)
  std::vector<float> work_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
  std::vector<float> masked_;
};

}  // namespace spw::runtime
