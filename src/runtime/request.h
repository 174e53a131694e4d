// What the runtime is asked to generate and what it hands back, token by token. Plain data: the
// server layer fills a GenerationRequest from an OpenAI request; the scheduler fills
// GeneratedTokens into the request's RequestStream.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/model_runner.h"
#include "runtime/logits_constraint.h"
#include "runtime/prompt_images.h"

namespace spw::runtime {

struct SamplingParams {
  float temperature = 1.f;  // 0 = greedy (argmax, lowest id on ties)
  float top_p = 1.f;        // nucleus mass in (0, 1]
  int top_k = 0;            // 0 = off
  float min_p = 0.f;        // drop tokens with p < min_p · p_max; 0 = off
  std::optional<uint64_t> seed;  // per-request RNG; unset = seeded from the OS
  float presence_penalty = 0.f;   // OpenAI semantics: over generated tokens only
  float frequency_penalty = 0.f;
  // vLLM's repetition_penalty, over the prompt's and the generated tokens: a seen token's logit l
  // becomes l / p when l > 0, else l · p; 1 = off.
  float repetition_penalty = 1.f;
  int top_logprobs = -1;  // -1: no logprobs; 0: the chosen token's only; k: also the k most likely
  // OpenAI logit_bias: (token id, bias in [-100, 100]) added to the logits before drawing, after any
  // constraint's mask (a bias never un-masks a token). Logprobs stay those of the model.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 16;                  // ≥ 1 (the server turns max_tokens = 0 into no request)
  std::vector<int32_t> stop_token_ids;  // finish (reason stop) when one is sampled; it is reported
  bool ignore_eos = false;
  // Also score the prompt: the logprob (and sampling.top_logprobs alternatives) of every prompt
  // token after the first, pushed to the stream as prefill goes. Skips the prefix cache and asks
  // the model for logits at every prompt position, so only requests that want it pay for it.
  bool prompt_logprobs = false;
  // Optional: restricts every sampled token (tool_choice "required" / a named function). Owned by
  // this one request; the scheduler thread calls it.
  std::shared_ptr<LogitsConstraint> constraint;
  // Optional: the prompt's image positions (a V4.1 prompt with images; the runner must take images).
  std::shared_ptr<const PromptImages> images;
};

using spw::TokenLogprob;

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0.f;              // log p(id) under the model's distribution (before sampling transforms)
  std::vector<TokenLogprob> top;    // top_logprobs most likely, most likely first
};

enum class FinishReason {
  none,       // still running
  stop,       // EOS or a stop token id
  length,     // max_tokens or the context limit
  cancelled,  // the client went away or the server is shutting down
  error,      // the scheduler's forward failed; message says why
};

const char* to_string(FinishReason reason);

}  // namespace spw::runtime
