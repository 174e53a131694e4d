#include "runtime/scheduler_metrics.h"

#include <algorithm>

namespace spw::runtime {
namespace {

const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                            0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
constexpr auto kRateWindow = std::chrono::seconds(10);

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double seconds) {
  const size_t i = size_t(std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin());
  ++counts[i];
  sum += seconds;
  ++count;
}

SchedulerMetrics::SchedulerMetrics() {
  s_.ttft = Histogram(kLatencyBounds);
  s_.inter_token = Histogram(kLatencyBounds);
  s_.step_time = Histogram(kLatencyBounds);
}

void SchedulerMetrics::set_gauges(int64_t queue_depth, int64_t running, int64_t kv_used, int64_t kv_capacity,
                               size_t cache_entries, size_t cache_nbytes, const RunnerUsage& runner) {
  std::lock_guard lock(mutex_);
  s_.queue_depth = queue_depth;
  s_.running = running;
  s_.kv_tokens_used = kv_used;
  s_.kv_tokens_capacity = kv_capacity;
  s_.prefix_cache_entries = cache_entries;
  s_.prefix_cache_nbytes = cache_nbytes;
  s_.runner = runner;
}

void SchedulerMetrics::set_device(std::string device) {
  std::lock_guard lock(mutex_);
  s_.device = std::move(device);
}

void SchedulerMetrics::on_admit(int64_t prompt_tokens, int64_t cached_tokens) {
  std::lock_guard lock(mutex_);
  s_.prompt_tokens += uint64_t(prompt_tokens);
  s_.prompt_tokens_cached += uint64_t(cached_tokens);
}

void SchedulerMetrics::on_step(double seconds, int64_t prefill_tokens, int64_t generated_tokens,
                               clock::time_point now) {
  std::lock_guard lock(mutex_);
  ++s_.steps;
  s_.step_time.observe(seconds);
  s_.prefill_tokens += uint64_t(prefill_tokens);
  s_.generation_tokens += uint64_t(generated_tokens);
  recent_.emplace_back(now, generated_tokens);
  while (!recent_.empty() && now - recent_.front().first > kRateWindow) recent_.pop_front();
}

void SchedulerMetrics::on_first_token(double seconds) {
  std::lock_guard lock(mutex_);
  s_.ttft.observe(seconds);
}

void SchedulerMetrics::on_inter_token(double seconds) {
  std::lock_guard lock(mutex_);
  s_.inter_token.observe(seconds);
}

void SchedulerMetrics::on_finish(bool cancelled) {
  std::lock_guard lock(mutex_);
  ++s_.requests_finished;
  if (cancelled) ++s_.requests_cancelled;
}

void SchedulerMetrics::on_reject() {
  std::lock_guard lock(mutex_);
  ++s_.requests_rejected;
}

void SchedulerMetrics::set_drafter(std::string drafter) {
  std::lock_guard lock(mutex_);
  s_.drafter = std::move(drafter);
}

void SchedulerMetrics::on_speculation(int64_t drafted, int64_t accepted) {
  std::lock_guard lock(mutex_);
  ++s_.spec_steps;
  s_.spec_drafted += uint64_t(drafted);
  s_.spec_accepted += uint64_t(accepted);
}

void SchedulerMetrics::on_preempt() {
  std::lock_guard lock(mutex_);
  ++s_.preemptions;
}

SchedulerSnapshot SchedulerMetrics::snapshot() const {
  std::lock_guard lock(mutex_);
  SchedulerSnapshot out = s_;
  const auto now = clock::now();
  int64_t tokens = 0;
  for (const auto& [t, n] : recent_)
    if (now - t <= kRateWindow) tokens += n;
  out.generation_tokens_per_s = double(tokens) / std::chrono::duration<double>(kRateWindow).count();
  return out;
}

}  // namespace spw::runtime
