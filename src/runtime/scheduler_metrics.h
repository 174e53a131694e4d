// Counters, gauges and latency histograms the scheduler keeps for /metrics. Written by the scheduler
// thread, read (as a snapshot) by HTTP threads; one mutex, taken once per step.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "model/model_runner.h"

namespace spw::runtime {

struct Histogram {
  std::vector<double> bounds;    // upper bounds, seconds, ascending (+Inf implied)
  std::vector<uint64_t> counts;  // per bucket, not cumulative; size bounds.size() + 1
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double seconds);
};

struct SchedulerSnapshot {
  int64_t queue_depth = 0;
  int64_t running = 0;
  int64_t kv_tokens_used = 0;      // positions held by running sequences
  int64_t kv_tokens_capacity = 0;
  uint64_t preemptions = 0;        // running sequences sent back to the queue to free KV
  uint64_t requests_finished = 0;
  uint64_t requests_rejected = 0;
  uint64_t requests_cancelled = 0;
  uint64_t prompt_tokens = 0;          // prompt tokens of admitted requests
  uint64_t prompt_tokens_cached = 0;   // of which served from the prefix cache
  uint64_t prefill_tokens = 0;         // prompt tokens actually computed
  uint64_t generation_tokens = 0;
  uint64_t steps = 0;
  uint64_t prefix_cache_entries = 0;
  uint64_t prefix_cache_nbytes = 0;
  std::string device;                  // the model runner's (ModelRunner::device)
  std::string drafter;                 // speculative decoding's drafter ("ngram"), empty when off
  uint64_t spec_steps = 0;             // steps that verified drafts of a sequence
  uint64_t spec_drafted = 0;           // tokens drafted (and verified)
  uint64_t spec_accepted = 0;          // of which accepted
  RunnerUsage runner;                  // the model runner's KV pages and device memory (-1: unknown)
  double generation_tokens_per_s = 0;  // over the last 10 s
  Histogram ttft{{}};
  Histogram inter_token{{}};
  Histogram step_time{{}};
};

class SchedulerMetrics {
 public:
  SchedulerMetrics();
  using clock = std::chrono::steady_clock;

  // All calls below are cheap and take the mutex.
  void set_gauges(int64_t queue_depth, int64_t running, int64_t kv_used, int64_t kv_capacity,
                  size_t cache_entries, size_t cache_nbytes, const RunnerUsage& runner);
  void set_device(std::string device);
  void set_drafter(std::string drafter);
  void on_speculation(int64_t drafted, int64_t accepted);
  void on_admit(int64_t prompt_tokens, int64_t cached_tokens);
  void on_step(double seconds, int64_t prefill_tokens, int64_t generated_tokens, clock::time_point now);
  void on_first_token(double seconds);
  void on_inter_token(double seconds);
  void on_finish(bool cancelled);
  void on_reject();
  void on_preempt();
  SchedulerSnapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  SchedulerSnapshot s_;
  std::deque<std::pair<clock::time_point, int64_t>> recent_;  // (step end, tokens generated)
};

}  // namespace spw::runtime
