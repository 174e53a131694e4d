// The scheduler's interface to a model (vLLM v1's scheduler → runner split): the scheduler decides
// which sequences take which tokens in a step; a ModelRunner owns the weights and every sequence's
// KV state and runs the step. Two implementations: the CPU reference (model/cpu_runner.h, any
// machine, the oracle in tests) and the GPU engine (engine/gpu_runner.h, CUDA builds).
//
// Contract, for every runner: a sequence's logits depend only on its own tokens, never on which
// other sequences share the step (the scheduler's "concurrent equals alone" guarantee rests on it);
// a one-token input is a decode step and a longer one a prefill piece (V4.1's stale-index-key quirk
// computes them differently, so the scheduler never splits a prompt into a one-token piece).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/image_positions.h"
#include "model/routing_counts.h"

namespace spw {

// One sequence's KV state, made by and only usable with the runner that made it.
class RunnerSequence {
 public:
  virtual ~RunnerSequence() = default;
  // Positions already in the state.
  virtual int64_t n_past() const = 0;
  // An independent copy of the state (what the prefix cache stores), or nullptr where this runner
  // cannot copy a state.
  virtual std::unique_ptr<RunnerSequence> clone() const = 0;
  // Bytes the state holds: what keeping a copy of it costs.
  virtual size_t nbytes() const = 0;
  // Takes back the positions [n_past, n_past()) of the last forward, which ran with
  // RunnerInput::keep_rollback (n_past ≥ where that forward started): speculative decoding's rejected
  // drafts. Errors: no such forward, or a runner that cannot (ModelRunner::max_rollback_tokens).
  virtual Status truncate(int64_t n_past) {
    (void)n_past;
    return make_error("this runner cannot take back positions of a sequence");
  }
};

// What a runner holds, for /metrics; -1 where the runner does not know or has no such thing.
struct RunnerUsage {
  int64_t kv_blocks_used = -1, kv_blocks_total = -1;          // pages of the KV pools
  int64_t device_bytes_used = -1, device_bytes_total = -1;    // the device's memory (all processes)
};

// A sequence's KV grown to n_total positions (seq == nullptr: a new sequence), for kv_can_hold. A new
// sequence that starts as a copy (RunnerSequence::clone) of copy_of may count the memory that copy
// would share with copy_of as already held.
struct KvGrowth {
  const RunnerSequence* seq = nullptr;
  int64_t n_total = 0;
  const RunnerSequence* copy_of = nullptr;
};

// A token's logprob under the model's distribution.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.f;
};

// A logit moved before the draw: a presence/frequency penalty or a logit_bias.
struct LogitShift {
  int32_t id = 0;
  float delta = 0.f;
};

// Most alternatives a TokenPick reports (OpenAI's top_logprobs limit).
inline constexpr int kMaxPickTopLogprobs = 20;

// The next token of a one-token input, for the runner to pick itself (on the device) instead of
// returning logits: the server sampler's whole pipeline (runtime/sampler.h) with the uniform u the
// sampler drew for it. In order: tokens outside `allowed` masked to −infinity; the logprobs taken
// from the masked logits; the logits of `repeated` divided by repetition_penalty where positive, else
// multiplied by it; `penalties` then `biases` added (each delta once, in two passes, so a token in
// both gets the penalty first, as on the host); then the draw: temperature ≤ 0 is greedy (the lowest
// id of the maximum), else top-k, min-p, top-p and the CDF inverted at u.
struct TokenPick {
  float temperature = 0.f;
  int32_t top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  double u = 0;
  float repetition_penalty = 1.f;     // 1: off
  std::vector<int32_t> repeated;      // with repetition_penalty ≠ 1: the ids seen (prompt and generated), unique
  std::vector<LogitShift> penalties;  // ids unique
  std::vector<LogitShift> biases;     // ids unique
  std::vector<uint64_t> allowed;      // empty: every token; else bit id of word id / 64 set = may come next
  int top_logprobs = -1;              // −1: no logprobs; k in 0..kMaxPickTopLogprobs: the chosen and k most likely
  // Out: the runner's pick, or −1 when it returned the logits instead.
  int32_t token = -1;
  float logprob = 0.f;             // with top_logprobs ≥ 0: the chosen token's (masked) logprob
  std::vector<TokenLogprob> top;   // and the top_logprobs most likely, most likely first (finite only)
};

struct RunnerInput {
  RunnerSequence* seq = nullptr;
  std::span<const int32_t> tokens;  // appended to seq; at least one
  bool all_logits = false;          // logits for every new position, else only the last
  // Optional, for a one-token input without all_logits: the runner may set pick->token and return
  // no logits for this input (an empty vector).
  TokenPick* pick = nullptr;
  // Keep what RunnerSequence::truncate needs to take back part of these tokens (at most
  // ModelRunner::max_rollback_tokens of them).
  bool keep_rollback = false;
  // Which of the tokens are image positions, and their embeddings (empty: text only). Only runners whose
  // takes_images() is true accept them.
  ImagePositions images{};
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelConfig& config() const = 0;
  // "cpu" or "cuda": where the forward runs (logged at start-up, shown in /metrics).
  virtual std::string_view device() const = 0;
  // The longest context one sequence may reach (positions), or 0 for no limit of the runner's own.
  virtual int64_t max_context() const = 0;
  // Sequences that may exist at once, or 0 for no limit of the runner's own.
  virtual int max_sequences() const = 0;
  // Copies (RunnerSequence::clone) the prefix cache may keep at once, on top of max_sequences()
  // running sequences; a negative value is no limit of the runner's own.
  virtual int max_cached_states() const { return -1; }
  // Cheap (host counters): the scheduler reads it after every step.
  virtual RunnerUsage usage() const { return {}; }
  // Whether the KV memory can take all of these growths at once on top of what every live sequence
  // (prefix-cache copies included) holds now: a new sequence's fixed part counts too, and each
  // sequence at most once. Exact for the runner's block granularity, so a forward whose growth was
  // accepted cannot run out of KV. Cheap (host counters). Runners without a KV limit: always true.
  virtual bool kv_can_hold(std::span<const KvGrowth> growth) const {
    (void)growth;
    return true;
  }

  // The most tokens of one forward its sequences can take back (RunnerSequence::truncate), which
  // speculative decoding needs; 0: none.
  virtual int max_rollback_tokens() const { return 0; }
  // Whether forward accepts inputs with image positions (RunnerInput::images).
  virtual bool takes_images() const { return false; }

  // Routing statistics (`serve --record-routing`): from set_routing_record(true) on, forward counts every
  // layer's expert picks; routing_counts() returns them so far. Not concurrently with forward.
  // Errors: a runner that cannot record.
  virtual Status set_routing_record(bool on) {
    (void)on;
    return make_error("this model runner does not record routing statistics");
  }
  virtual Result<RoutingCounts> routing_counts() const { return make_error("routing is not being recorded"); }

  // A new empty sequence. Errors: the runner's sequence slots or KV memory are exhausted.
  virtual Result<std::unique_ptr<RunnerSequence>> new_sequence() = 0;
  // One step: appends each input's tokens to its sequence (each sequence at most once) and returns,
  // per input in order, its logits: [vocab] for the last new position, or [n, vocab] with all_logits.
  // Errors: invalid tokens or sequences, KV memory exhausted (both checked before any sequence
  // advances), device failures (after which the step's sequences must not be used again).
  virtual Result<std::vector<std::vector<float>>> forward(std::span<const RunnerInput> inputs) = 0;
};

}  // namespace spw
