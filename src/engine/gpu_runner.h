// The GPU engine (engine/gpu_model.h) as a ModelRunner (model/model_runner.h), what `spillway serve
// --device cuda` runs. Each sequence is a GpuSequence: a slot in the model's page tables and its pages
// in the KV pools, returned when the sequence is destroyed.
//
// A step runs the one-token inputs that want only their last logits as batched decodes
// (GpuModel::decode) and every other input (a prefill piece) together in GpuModel::forward_chunks steps of up to
// step_max_rows rows (the weights read once for all of them). TokenPicks are drawn
// on the device with the sampler's whole pipeline (mask, logprobs, penalties and biases, then argmax or
// cuda::sample with the sampler's uniform: decode calls of their own, no logits copied back, only the
// token and its logprobs); every other result is logits on the host, where the scheduler samples.
// With batch_invariant (the default) every kernel computes each row from that row alone, on paths that do not
// depend on the step, so a sequence's result is what it computes alone whatever else runs
// (tests/gpu/test_engine_batch.cpp, tests/gpu/test_gpu_runner.cpp; through the server: tools/serve/check_gpu_runner.py):
//  - decode steps force the GEMV for every linear (in slices of 16 rows past 16, 64 on tensor cores) and a decode
//    call takes at most GpuModel::invariant_decode_rows() sequences (64 for dense-table experts; every sequence for
//    EXL3 experts: device pairs, then host-dispatched items of the pairs' class, make_batch_invariant);
//  - prefill pieces short enough to compute as decode rows (GpuModel::chunk_computes_as_decode: verified drafts)
//    run together as such; other text pieces shorter than GpuModel::kRowInvariantPieceTokens together on
//    GpuModel::ChunkPath::kRowInvariant; longer pieces and pieces with image positions each alone (GpuModel::forward).
// Without it decode calls take the whole batch, which past 16 rows takes GEMMs whose per-row sums may depend on the
// batch size, and prefill pieces take forward_chunks' row-count-dependent paths.
// The prefix cache keeps device copies of sequences (GpuModel::copy_sequence) in prefix_cache_slots
// slots of their own, on top of the running sequences; a hit copies the cached state into a new
// sequence (with GpuSettings::kv_share_pages, sharing the full pages of compressed entries and index
// keys instead). The pools hold budget.pool_tokens positions (GpuModel::can_hold answers kv_can_hold
// page by page, counting a copy's pages as new: exact without sharing, an upper bound with it).
// Inputs kept for rollback (speculative decoding's verified drafts) can be taken back to any of their
// positions (GpuModel::truncate) when the budget sets max_rollback_tokens.
// Not thread-safe: one scheduler thread calls it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/settings.h"
#include "engine/memory_plan.h"
#include "model/model.h"
#include "model/model_runner.h"

namespace spw::engine {

class GpuModel;
struct GpuModelOptions;

// CUDA devices visible to this process (0 when there is no driver or device).
int cuda_device_count();

// Free and total bytes of device 0's memory, or an error naming the CUDA failure.
struct DeviceMemory {
  size_t free = 0, total = 0;
};
Result<DeviceMemory> device_memory();

struct GpuRunnerSettings {
  KvBudget budget;  // running sequences, context and step tokens (the pools also hold prefix_cache_slots)
  Numerics numerics = Numerics::reference();
  GpuSettings gpu;                               // kernel switches and expert paths (base/settings.h)
  bool batch_invariant = true;                   // see above
  int prefix_cache_slots = 8;                    // sequence slots (and their pool pages) for cached copies
  ExpertTiers expert_tiers;                      // where the routed experts live (GpuModelOptions::expert_tiers)
  int host_expert_threads = 0;                   // the CPU worker's threads (GpuModelOptions::host_expert_threads)
  bool host_expert_int16 = false;                // GpuModelOptions::host_expert_int16
  EngramTablePlace engram_tables = EngramTablePlace::kAuto;  // GpuModelOptions::engram_tables
  std::function<void(int done, int total)> on_progress;  // layers read from the checkpoint
};

class GpuRunner final : public ModelRunner {
 public:
  // model's budget holds the running sequences plus cache_slots.
  GpuRunner(std::unique_ptr<GpuModel> model, bool batch_invariant, int cache_slots);
  ~GpuRunner() override;

  const ModelConfig& config() const override;
  std::string_view device() const override { return "cuda"; }
  int64_t max_context() const override;
  int max_sequences() const override;
  int max_cached_states() const override { return cache_slots_; }
  int max_rollback_tokens() const override;
  // V4.1 image positions run in the forward; the image encoder itself is the host's (server/chat_images.cpp).
  bool takes_images() const override { return config().is_v41(); }
  RunnerUsage usage() const override;
  bool kv_can_hold(std::span<const KvGrowth> growth) const override;
  Status set_routing_record(bool on) override;
  Result<RoutingCounts> routing_counts() const override;
  Result<std::unique_ptr<RunnerSequence>> new_sequence() override;
  Result<std::vector<std::vector<float>>> forward(std::span<const RunnerInput> inputs) override;

  GpuModel& model() { return *model_; }

  // Runs a scratch sequence through two prompt pieces of min(64, max_step_tokens) tokens, one on GpuModel::forward
  // and one on the path forward() gives pieces of that length, a piece of a single token and two batch-1 decode
  // steps, then frees it. Before serving: CUDA loads kernel modules on their
  // first launch and the decode graphs are captured on first use, which the first request would otherwise wait
  // for. Leaves no state behind (the sequence's pages return to the pools).
  Status warm_up();

 private:
  std::unique_ptr<GpuModel> model_;
  int cache_slots_;      // slots kept for the prefix cache's copies
  bool batch_invariant_;  // see the top
  int max_decode_rows_;  // sequences per decode call
};

// What batch_invariant asks of the engine (see the top): EXL3 decodes with one numerics at every row count (the
// grouped kernel's one-token-group class, MoePaths::exl3_fixed_classes), in the options before loading; every decode
// linear on the GEMV after.
void make_batch_invariant(GpuModelOptions& options);
void make_batch_invariant(GpuModel& model);

// Applies settings.gpu's kernel switches (process-wide) and loads the model onto device 0 with pools
// for settings.budget (GpuModelOptions' defaults otherwise).
Result<std::unique_ptr<GpuRunner>> load_gpu_runner(const std::string& model_dir, const GpuRunnerSettings& settings);

}  // namespace spw::engine
