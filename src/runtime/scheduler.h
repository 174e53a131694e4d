// The scheduler: one thread that owns the model runner (model/model_runner.h: the CPU reference or
// the GPU engine; neither is reentrant), running continuous batching over every admitted sequence.
//
// Each step: reap cancelled sequences, admit waiting requests in FIFO order while the KV capacity
// model allows (sum over running sequences of prompt + max_tokens ≤ kv_tokens, and at most
// max_num_seqs), plan (decode tokens first, then chunked-prefill pieces under the step token
// budget), hand the step to the runner, sample, push tokens to each request's stream.
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

namespace spw::runtime {

struct SchedulerSettings {
  int max_num_seqs = 64;        // sequences admitted (running) at once
  int max_batch = 64;           // sequences in one forward_batch step
  int64_t kv_tokens = 262144;   // KV capacity model: Σ (prompt + max_tokens) over running sequences
  int max_queue = 256;          // requests waiting for admission; beyond this, submit is refused
  int prefill_chunk = 256;      // prefill piece size (multiple of prefix_block)
  int step_token_budget = 512;  // tokens per step (decodes + prefill pieces), ≥ prefill_chunk
  int prefix_block = 16;        // prefix-cache block, tokens
  size_t prefix_cache_nbytes = size_t(1) << 30;  // 0 disables the prefix cache
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
  // The runner must outlive the scheduler. max_num_seqs and max_batch are capped at the runner's
  // max_sequences().
  Scheduler(ModelRunner& runner, SchedulerSettings settings);
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
  void admit_locked();
  // Gives the sequence its state (a prefix-cache copy or a new one); false: none could be made and
  // the request is finished with the error.
  bool start_sequence(Sequence& seq);
  void run_step();
  Result<std::vector<std::vector<float>>> forward(const std::vector<size_t>& members,
                                                  std::span<const std::span<const int32_t>> tokens);
  void finish(Sequence& seq, FinishReason reason, std::string error = {});
  void release_locked(Sequence& seq);
  void publish_gauges();

  ModelRunner& runner_;
  const SchedulerSettings settings_;
  SchedulerMetrics metrics_;
  PrefixCache prefix_cache_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> waiting_;   // guarded by mutex_
  std::vector<std::unique_ptr<Sequence>> admitted_;  // guarded by mutex_; the scheduler picks them up
  int64_t kv_reserved_ = 0;                          // guarded by mutex_
  int64_t n_active_ = 0;                             // admitted + running, guarded by mutex_
  bool draining_ = false, stopping_ = false, cancel_all_ = false;

  std::vector<std::unique_ptr<Sequence>> running_;  // scheduler thread only
  size_t rotate_ = 0;
  std::thread thread_;
};

}  // namespace spw::runtime
