// The scheduler: one thread that owns the model runner (model/model_runner.h: the CPU reference or
// the GPU engine; neither is reentrant), running continuous batching over every admitted sequence.
//
// Each step: reap cancelled sequences, admit waiting requests in FIFO order while a seat is free (at
// most max_num_seqs) and the runner's KV memory can hold them (ModelRunner::kv_can_hold: the blocks
// actually held, not prompt + max_tokens), plan (decode tokens first, then chunked-prefill pieces under
// the step token budget), make room for the step's KV growth (dropping prefix-cache copies, then
// preempting the most recently admitted sequences back to the head of the queue), hand the step to
// the runner, sample, push tokens to each request's stream. A preempted sequence is recomputed when
// readmitted: its prompt prefilled again (the prefix cache may serve it) and its generated tokens
// replayed as one-token decode inputs, so it computes exactly what it computed before.
// HTTP threads only call submit() and talk to their RequestStream.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/model_runner.h"
#include "runtime/prefix_cache.h"
#include "runtime/request_stream.h"
#include "runtime/sampler.h"
#include "runtime/scheduler_metrics.h"
#include "runtime/speculative.h"
#include "runtime/step_plan.h"

namespace spw::runtime {

struct SchedulerSettings {
  int max_num_seqs = 64;        // sequences admitted (running) at once
  int max_batch = 64;           // sequences in one forward_batch step
  int64_t kv_tokens = 262144;   // KV positions the runner holds; a request's prompt + max_tokens must fit
  int max_queue = 256;          // requests waiting for admission; beyond this, submit is refused
  int prefill_chunk = 256;      // prefill piece size (multiple of prefix_block)
  int step_token_budget = 512;  // tokens per step (decodes + prefill pieces), ≥ prefill_chunk
  int prefix_block = 16;        // prefix-cache block, tokens
  size_t prefix_cache_nbytes = size_t(1) << 30;  // 0 disables the prefix cache
  SpeculativeSettings speculative;               // needs a runner with max_rollback_tokens
};

enum class SubmitCode { ok, invalid, too_large, queue_full, draining };

struct Submission {
  SubmitCode code = SubmitCode::ok;
  std::string message;
  std::shared_ptr<RequestStream> stream;  // set when code == ok
  std::string param = "prompt";           // the request field at fault, for invalid
};

class Scheduler {
 public:
  using clock = std::chrono::steady_clock;

  // The runner must outlive the scheduler. max_num_seqs and max_batch are capped at the runner's
  // max_sequences(). Speculation on a runner that cannot truncate is an error (check with
  // check_speculative first).
  Scheduler(ModelRunner& runner, SchedulerSettings settings);
  // Whether the runner can run the speculative settings; the error says what to change.
  static Status check_speculative(const ModelRunner& runner, const SpeculativeSettings& settings);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Thread-safe. Validates (token ids, max_tokens, capacity) and queues; never blocks on the model.
  Submission submit(GenerationRequest request);

  // Refuse new submissions from now on (graceful shutdown); running and queued ones continue.
  void drain();
  // Cancel everything queued and running (they finish with FinishReason::cancelled).
  void cancel_all();
  // Nothing queued or running.
  bool idle() const;
  // Cancels what is left and joins the scheduler thread. Idempotent.
  void stop();

  const SchedulerSettings& settings() const { return settings_; }
  SchedulerSnapshot metrics() const { return metrics_.snapshot(); }

 private:
  struct Sequence;
  void loop();
  // Moves waiting requests that fit to the caller (who starts them); mutex_ held.
  std::vector<std::unique_ptr<Sequence>> admit_locked();
  // Gives the sequence its state (a prefix-cache copy or a new one); false: none could be made and
  // the request is finished with the error.
  bool start_sequence(Sequence& seq);
  StepPlan plan_within_kv(std::vector<PlanEntry>& entries);
  void preempt(size_t i);
  // Drafts the tokens a decoding sequence verifies this step (Sequence::step_tokens), if any.
  void draft(Sequence& seq);
  // Hands a generated token to the sequence and its stream; true when that finished the sequence.
  bool emit(Sequence& seq, GeneratedToken token, clock::time_point now);
  // Accepts a prefix of the step's drafts from its logits [1 + drafts, vocab], emits them and the
  // token after them, and takes the rejected drafts back from the state; true when the sequence finished.
  bool verify_drafts(Sequence& seq, const std::vector<float>& logits, clock::time_point now);
  void run_step();
  // The prompts of the queued requests that will look in the prefix cache (the copies to keep for them).
  std::vector<std::span<const int32_t>> queued_prompts() const;
  Result<std::vector<std::vector<float>>> forward(const std::vector<size_t>& members,
                                                  std::span<const std::span<const int32_t>> tokens,
                                                  std::span<TokenPick> picks, std::span<const char> offered);
  void finish(Sequence& seq, FinishReason reason, std::string error = {});
  void release_locked(Sequence& seq);
  void publish_gauges();

  ModelRunner& runner_;
  const SchedulerSettings settings_;
  SchedulerMetrics metrics_;
  PrefixCache prefix_cache_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> waiting_;  // guarded by mutex_; preempted sequences go first
  int64_t n_active_ = 0;                            // admitted sequences, guarded by mutex_
  bool draining_ = false, stopping_ = false, cancel_all_ = false;

  std::vector<std::unique_ptr<Sequence>> running_;  // scheduler thread only
  size_t rotate_ = 0;
  std::thread thread_;
};

}  // namespace spw::runtime
