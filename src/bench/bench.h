// `spillway bench`: the GPU engine's performance on one checkpoint, in one process: the H200's copy bandwidth and bf16 tensor-core rate (device_rates.h); the memory plan
// (printed before loading); batch-1 decode ms/token against the bytes a token must read ÷ bandwidth
// (model_costs.h); aggregate decode tokens/s at several batch sizes with sequences of different
// lengths; prefill tokens/s against the FLOPs per token ÷ tensor-core rate; device memory per
// component (plan and cudaMemGetInfo); the projection to the full model's layer count with its
// arithmetic. Inputs are random token ids (the synthetic checkpoints of tools/synth have random
// weights; what is timed does not depend on the ids beyond routing).
//
// Batched decode uses GpuModel::decode when the engine has it, else forward() per sequence (said in
// the output). Every phase checks that the logits it sees are finite (a NaN forward would make the
// timing meaningless) and reports it. Errors (no GPU, model does not fit, CUDA failures) return a
// non-zero exit code with the message; phases that do not fit the budget are skipped with a reason.
// Tests: tests/python/test_synth_model.py runs `--plan-only` (no GPU needed); the GPU phases run in
// scripts/bench_engine.sh on the H200.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/settings.h"
#include "model/expert_tier.h"
#include "model/synthetic_model.h"

namespace spw::bench {

struct EngineBenchOptions {
  std::string model_dir;
  // Instead of model_dir: a model built in memory (`--synthetic`), whose checkpoint the bench moves into the engine.
  std::shared_ptr<SyntheticModel> synthetic;
  std::vector<int> batches{1, 4, 16, 64};
  std::vector<int64_t> prefill{4096, 40960};
  int decode_steps = 32;            // timed batch-1 decode steps
  int64_t decode_context = 1024;    // prompt before the batch-1 decode
  int batch_steps = 16;             // timed steps per batch size
  int64_t batch_prompt_max = 1024;  // batch prompts spread over [max/4, max]
  int chunk = 4096;                 // prefill chunk = the budget's max_step_tokens
  int prefill_runs = 3;             // timed prefill runs per length (the median is reported)
  int max_seqs = 0;                 // 0: the largest batch
  int64_t max_context = 0;          // 0: what the runs need
  int project_layers = 0;           // 0: 40 (V4.1) or 43 (V4)
  int copy_mib = 2048;              // bytes copied per bandwidth sample
  uint64_t seed = 1;
  bool plan_only = false;           // print the plan and the per-token costs; no GPU needed
  bool batch_invariant = false;     // decode as the batch-invariant runner does (engine/gpu_runner.h)
  std::string json_path;
  std::string record_routing;       // write the batch-1 phase's routing counts here (runtime/routing_stats.h format)
  GpuSettings gpu;                  // kernel switches and MoE paths (the CLI passes settings().gpu)
  ExpertTiers expert_tiers;         // where the routed experts live (empty: all on the GPU; cli/expert_placement.h)
  int host_expert_threads = 0;      // the CPU expert worker's threads (0: all)
  bool host_expert_int16 = false;   // the CPU expert worker's approximate int16 activations
};

// Runs the benchmark, printing to stdout; returns the process exit code.
int run_engine_bench(const EngineBenchOptions& options);

}  // namespace spw::bench
