// The CPU reference as a ModelRunner (model/model_runner.h): the f32 forward of model/model.h, each
// sequence's KV a SequenceState in host memory. Runs the demo model on any machine and is the oracle
// the GPU runner is tested against. Not thread-safe: one scheduler thread calls it.
#pragma once

#include "model/model.h"
#include "model/model_runner.h"

namespace spw {

// A SequenceState behind the runner interface (a complete value, so clone() is an exact copy at any
// token boundary).
class CpuSequence final : public RunnerSequence {
 public:
  explicit CpuSequence(SequenceState state) : state(std::move(state)) {}
  int64_t n_past() const override { return state.n_past; }
  std::unique_ptr<RunnerSequence> clone() const override { return std::make_unique<CpuSequence>(state); }
  size_t nbytes() const override;

  SequenceState state;
};

class CpuRunner final : public ModelRunner {
 public:
  explicit CpuRunner(const Model& model) : model_(model) {}

  const ModelConfig& config() const override { return model_.config(); }
  std::string_view device() const override { return "cpu"; }
  int64_t max_context() const override { return 0; }
  int max_sequences() const override { return 0; }
  Result<std::unique_ptr<RunnerSequence>> new_sequence() override;
  // One forward_batch per kind of input (last-position logits, all logits), so each routed expert
  // runs once per kind for every sequence's tokens.
  Result<std::vector<std::vector<float>>> forward(std::span<const RunnerInput> inputs) override;

 private:
  const Model& model_;
};

}  // namespace spw
