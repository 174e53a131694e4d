#include "server/metrics_text.h"

#include <cstdio>

namespace spw::server {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + num(value) + "\n";
}

void histogram(std::string& out, const char* name, const char* help, const runtime::Histogram& h) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    out += std::string(name) + "_bucket{le=\"" + num(h.bounds[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(h.count) + "\n";
  out += std::string(name) + "_sum " + num(h.sum) + "\n";
  out += std::string(name) + "_count " + std::to_string(h.count) + "\n";
}

}  // namespace

std::string render_metrics(const runtime::SchedulerSnapshot& s) {
  std::string out;
  metric(out, "spillway_queue_depth", "gauge", "Requests waiting for admission.", double(s.queue_depth));
  metric(out, "spillway_running_sequences", "gauge", "Sequences admitted and not finished.", double(s.running));
  metric(out, "spillway_kv_tokens_used", "gauge", "KV positions held by running sequences.", double(s.kv_tokens_used));
  metric(out, "spillway_kv_tokens_capacity", "gauge", "KV capacity in tokens (--kv-tokens).", double(s.kv_tokens_capacity));
  metric(out, "spillway_kv_usage_ratio", "gauge", "kv_tokens_used / kv_tokens_capacity.",
         s.kv_tokens_capacity ? double(s.kv_tokens_used) / double(s.kv_tokens_capacity) : 0.0);
  if (!s.device.empty()) {
    out += "# HELP spillway_runner_info Where the model runs (serve --device).\n# TYPE spillway_runner_info gauge\n";
    out += "spillway_runner_info{device=\"" + s.device + "\"} 1\n";
  }
  if (s.runner.kv_blocks_total >= 0) {
    metric(out, "spillway_kv_blocks_used", "gauge", "KV blocks (GPU: pool pages) held by sequences and prefix-cache copies.",
           double(s.runner.kv_blocks_used));
    metric(out, "spillway_kv_blocks_total", "gauge", "KV blocks (GPU: pool pages) in all.", double(s.runner.kv_blocks_total));
  }
  if (s.runner.device_bytes_total >= 0) {
    metric(out, "spillway_device_memory_used_bytes", "gauge", "Device memory in use (all processes), read each scheduler step.",
           double(s.runner.device_bytes_used));
    metric(out, "spillway_device_memory_total_bytes", "gauge", "Device memory in all.", double(s.runner.device_bytes_total));
  }
  metric(out, "spillway_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", double(s.prompt_tokens));
  metric(out, "spillway_prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache.",
         double(s.prompt_tokens_cached));
  metric(out, "spillway_prefix_cache_hit_ratio", "gauge", "Prompt tokens served from the prefix cache / prompt tokens.",
         s.prompt_tokens ? double(s.prompt_tokens_cached) / double(s.prompt_tokens) : 0.0);
  metric(out, "spillway_prefix_cache_entries", "gauge", "Snapshots in the prefix cache.", double(s.prefix_cache_entries));
  metric(out, "spillway_prefix_cache_bytes", "gauge", "Bytes held by the prefix cache.", double(s.prefix_cache_nbytes));
  metric(out, "spillway_prefill_tokens_total", "counter", "Prompt tokens computed.", double(s.prefill_tokens));
  metric(out, "spillway_generation_tokens_total", "counter", "Tokens generated.", double(s.generation_tokens));
  metric(out, "spillway_generation_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.",
         s.generation_tokens_per_s);
  metric(out, "spillway_scheduler_steps_total", "counter", "Scheduler steps run.", double(s.steps));
  metric(out, "spillway_requests_finished_total", "counter", "Requests finished (any reason).", double(s.requests_finished));
  metric(out, "spillway_requests_cancelled_total", "counter", "Requests cancelled (client gone, stop text, shutdown).",
         double(s.requests_cancelled));
  metric(out, "spillway_preemptions_total", "counter",
         "Running sequences sent back to the queue to free KV memory (recomputed when readmitted).",
         double(s.preemptions));
  metric(out, "spillway_requests_rejected_total", "counter", "Requests refused because the queue was full.",
         double(s.requests_rejected));
  if (!s.drafter.empty()) {
    const std::string label = "{drafter=\"" + s.drafter + "\"}";
    const auto labelled = [&](const char* name, const char* type, const char* help, double value) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
      out += std::string(name) + label + " " + std::to_string(value) + "\n";
    };
    labelled("spillway_spec_verify_steps_total", "counter", "Sequence steps that verified drafted tokens.",
             double(s.spec_steps));
    labelled("spillway_spec_draft_tokens_total", "counter", "Tokens drafted and verified.", double(s.spec_drafted));
    labelled("spillway_spec_accepted_tokens_total", "counter", "Drafted tokens accepted.", double(s.spec_accepted));
    labelled("spillway_spec_mean_acceptance_length", "gauge",
             "Tokens emitted per verifying step (accepted drafts + the step's own token).",
             s.spec_steps ? double(s.spec_accepted + s.spec_steps) / double(s.spec_steps) : 0.0);
  }
  histogram(out, "spillway_time_to_first_token_seconds", "Submission to first generated token.", s.ttft);
  histogram(out, "spillway_inter_token_latency_seconds", "Time between consecutive tokens of a request.", s.inter_token);
  histogram(out, "spillway_step_duration_seconds", "Duration of one scheduler step (forward of the batch).",
            s.step_time);
  return out;
}

}  // namespace spw::server
