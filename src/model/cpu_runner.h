// The CPU reference as a ModelRunner (model/model_runner.h): the f32 forward of model/model.h, each
// sequence's KV a SequenceState in host memory. Runs the demo model on any machine and is the oracle
// the GPU runner is tested against. Not thread-safe: one scheduler thread calls it.
//
// KV capacity: with kv_tokens > 0 the runner keeps the GPU pools' discipline in host memory, so the
// scheduler's admission and preemption behave the same on both: every live state (running sequences
// and prefix-cache copies) holds ceil(n_past / kCpuKvBlockTokens) blocks of a pool of
// kv_tokens / kCpuKvBlockTokens, and a forward that would exceed the pool is refused.
#pragma once

#include <memory>
#include <optional>

#include "model/model.h"
#include "model/model_runner.h"

namespace spw {

inline constexpr int64_t kCpuKvBlockTokens = 16;

// Blocks held by a CPU runner's live states, shared by the runner and its sequences (which may outlive
// neither; the ledger keeps the count valid whichever is destroyed last).
struct CpuKvLedger {
  int64_t total_blocks = 0;  // 0: no limit
  int64_t used_blocks = 0;
};

// A SequenceState behind the runner interface (a complete value, so clone() is an exact copy at any
// token boundary).
class CpuSequence final : public RunnerSequence {
 public:
  // A state counted in `ledger` (by default one of its own, with no limit); `model` is the one its
  // forwards run on, which truncate needs (without one, truncate fails).
  explicit CpuSequence(SequenceState state, const Model* model = nullptr,
                       std::shared_ptr<CpuKvLedger> ledger = std::make_shared<CpuKvLedger>());
  ~CpuSequence() override;
  int64_t n_past() const override { return state.n_past; }
  std::unique_ptr<RunnerSequence> clone() const override;
  size_t nbytes() const override;
  Status truncate(int64_t n_past) override;
  // Re-counts the blocks after the state grew or shrank.
  void account();

  SequenceState state;

 private:
  const Model* model_;
  std::shared_ptr<CpuKvLedger> ledger_;
  int64_t blocks_ = 0;
};

class CpuRunner final : public ModelRunner {
 public:
  // kv_tokens: the KV capacity in positions over all live states (0: no limit).
  explicit CpuRunner(const Model& model, int64_t kv_tokens = 0);

  const ModelConfig& config() const override { return model_.config(); }
  std::string_view device() const override { return "cpu"; }
  int64_t max_context() const override { return 0; }
  int max_sequences() const override { return 0; }
  int max_rollback_tokens() const override { return model_.config().window; }
  bool takes_images() const override { return model_.config().is_v41(); }
  RunnerUsage usage() const override;
  bool kv_can_hold(std::span<const KvGrowth> growth) const override;
  Result<std::unique_ptr<RunnerSequence>> new_sequence() override;
  // One forward_batch per kind of input (last-position logits, all logits), so each routed expert
  // runs once per kind for every sequence's tokens. Greedy TokenPicks are answered (argmax, lowest
  // id on ties), others with logits.
  Result<std::vector<std::vector<float>>> forward(std::span<const RunnerInput> inputs) override;
  Status set_routing_record(bool on) override;
  Result<RoutingCounts> routing_counts() const override;

 private:
  const Model& model_;
  std::shared_ptr<CpuKvLedger> ledger_;
  std::optional<RoutingCounts> routing_;  // while recording
};

}  // namespace spw
