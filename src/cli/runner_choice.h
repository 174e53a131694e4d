// Which model runner `spillway serve` and `spillway run` use, and loading it: the CPU reference (model/cpu_runner.h)
// or the GPU engine (engine/gpu_runner.h, CUDA builds). `--device auto` takes the GPU when this build
// has it, a CUDA device is visible and the model is not the bundled demo model (which the CPU serves
// at interactive speed on any machine); the choice and its reason are logged. Before a GPU load the
// memory plan is logged, and a plan larger than the free device memory is an error naming the flags
// that shrink it.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "cli/expert_placement.h"
#include "model/model.h"
#include "model/model_runner.h"

namespace spw::cli {

struct RunnerOptions {
  std::string device = "auto";  // auto, cpu or cuda
  std::string model_dir;
  Numerics numerics = Numerics::reference();
  // The KV budget: each sequence may reach max_model_len positions, all of them together kv_tokens
  // (the GPU's pools, and the CPU runner's accounting; 0: every sequence at max_model_len).
  int max_num_seqs = 64;  // running sequences
  int64_t max_model_len = 8192;
  int64_t kv_tokens = 0;
  int prefill_chunk = 256;
  int step_rows = 0;  // GPU: rows of one multi-sequence prefill step (serve's --step-token-budget); 0: prefill_chunk
  bool batch_invariant = true;  // GPU: rows computed independently of the batch (engine/gpu_runner.h)
  int prefix_cache_slots = 8;   // GPU: sequence slots for the prefix cache's device copies
  int max_rollback_tokens = 0;  // GPU: tokens of a step the runner can take back (speculative decoding); 0: none
  PlacementFlags placement;     // GPU: where the routed experts live (cli/expert_placement.h)
  std::string engram_tables = "auto";  // GPU: auto, pinned or disk (engine/gpu_model.h EngramTablePlace)
  bool warm_up = false;         // GPU: GpuRunner::warm_up before returning (serve: the first request does not wait)
};

struct LoadedRunner {
  std::unique_ptr<Model> cpu_model;  // the CPU runner's model (null for the GPU runner)
  std::unique_ptr<ModelRunner> runner;
};

Result<LoadedRunner> load_runner(const RunnerOptions& options);

}  // namespace spw::cli
