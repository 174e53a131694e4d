// `spillway bench --model DIR`: the GPU engine's decode, batched decode and prefill speed against the
// GPU's own measured bandwidth and tensor-core rate, memory per component, and the projection to the
// full model (src/bench/bench.h). CUDA builds only; elsewhere it says so.
#include <cstdio>
#include <memory>

#include "base/settings.h"
#include "cli/commands.h"
#include "cli/expert_placement.h"
#include "cli/load_progress.h"
#include "model/config.h"
#include "model/synthetic_model.h"
#if defined(SPW_HAVE_BENCH)
#include "bench/bench.h"
#endif

namespace spw::cli {
namespace {

struct BenchFlags {
  std::string model_dir, json_path, record_routing;
  std::vector<int> batches{1, 4, 16, 64};
  std::vector<int64_t> prefill{4096, 40960};
  int decode_steps = 32, batch_steps = 16, chunk = 4096, prefill_runs = 3, max_seqs = 0, project_layers = 0, copy_mib = 2048;
  int64_t decode_context = 1024, batch_prompt_max = 1024, max_context = 0;
  uint64_t seed = 1;
  bool plan_only = false, batch_invariant = false;
  std::string synthetic;  // --synthetic NAME: the model built in memory (model/synthetic_model.h)
  SyntheticSpec spec;
  PlacementFlags placement;
};

int run_bench(const BenchFlags& f) {
#if defined(SPW_HAVE_BENCH)
  bench::EngineBenchOptions o;
  o.model_dir = f.model_dir;
  o.json_path = f.json_path;
  o.record_routing = f.record_routing;
  o.batches = f.batches;
  o.prefill = f.prefill;
  o.decode_steps = f.decode_steps;
  o.batch_steps = f.batch_steps;
  o.chunk = f.chunk;
  o.prefill_runs = f.prefill_runs;
  o.max_seqs = f.max_seqs;
  o.project_layers = f.project_layers;
  o.copy_mib = f.copy_mib;
  o.decode_context = f.decode_context;
  o.batch_prompt_max = f.batch_prompt_max;
  o.max_context = f.max_context;
  o.seed = f.seed;
  o.plan_only = f.plan_only;
  o.batch_invariant = f.batch_invariant;
  o.gpu = settings().gpu;
  if (f.synthetic.empty() == f.model_dir.empty()) {
    std::fprintf(stderr, "spillway bench: give --model DIR or --synthetic v41-flash (one of them)\n");
    return 2;
  }
  Result<ModelConfig> config = make_error("no model");
  if (!f.synthetic.empty()) {
    SyntheticSpec spec = f.spec;
    spec.name = f.synthetic;
    spec.seed = f.seed;
    auto synthetic = make_synthetic_model(spec, layer_progress("building " + synthetic_model_name(spec)));
    if (!synthetic.ok()) {
      std::fprintf(stderr, "spillway bench: %s\n", synthetic.error().message.c_str());
      return 2;
    }
    config = synthetic->config;
    o.synthetic = std::make_shared<SyntheticModel>(std::move(synthetic.value()));
  } else {
    config = read_model_config(f.model_dir);
  }
  if (!config.ok()) {
    std::fprintf(stderr, "spillway bench: %s\n", config.error().message.c_str());
    return 1;
  }
  auto tiers = resolve_expert_tiers(o.synthetic ? o.synthetic->checkpoint.root() : f.model_dir, *config, f.placement,
                                    o.synthetic ? &o.synthetic->checkpoint : nullptr);
  if (!tiers.ok()) {
    std::fprintf(stderr, "spillway bench: %s\n", tiers.error().message.c_str());
    return 1;
  }
  o.expert_tiers = std::move(tiers.value());
  o.host_expert_threads = f.placement.cpu_expert_threads;
  o.host_expert_int16 = f.placement.cpu_expert_activations == "int16";
  return bench::run_engine_bench(o);
#else
  std::fprintf(stderr, "spillway bench: this build has no GPU engine (CUDA was not found at configure time); "
                       "build with nvcc available (-DSPILLWAY_CUDA=ON)\n");
  return 2;
#endif
}

}  // namespace

std::function<int()> add_bench_command(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "GPU engine benchmark: decode vs HBM roofline, batched decode, prefill vs "
                                              "tensor-core rate, memory, projection to the full model");
  auto* model = cmd->add_option("--model,-m", f->model_dir,
                                "model directory (e.g. from tools/synth/make_synthetic_model.py)");
  auto* synthetic = cmd->add_option("--synthetic", f->synthetic,
                                    "instead of --model: build this model in memory with random weights in the "
                                    "released formats (v41-flash; no disk needed: docs/placement.md)")
                        ->excludes(model);
  cmd->add_option("--layers", f->spec.layers, "--synthetic: the real model's layers 0..N-1")
      ->check(CLI::Range(1, 40))
      ->capture_default_str()
      ->needs(synthetic);
  cmd->add_option("--expert-bits", f->spec.expert_bits,
                  "--synthetic: routed experts as EXL3 with K bits per weight (1..8), or 0 for MXFP4 as released")
      ->check(CLI::Range(0, 8))
      ->capture_default_str()
      ->needs(synthetic);
  cmd->add_option("--routing-skew", f->spec.routing_skew,
                  "--synthetic: S > 0 gives each layer hot and cold experts (router bias -S*ln(1 + rank) over a "
                  "random ranking; with 384 experts 0.15 gives each layer's top quarter ~85% of the routes)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->needs(synthetic);
  cmd->add_option("--engram-vocab", f->spec.engram_vocab,
                  "--synthetic: engram_vocab_size (the released 16,000,000 makes 98 GB tables)")
      ->capture_default_str()
      ->needs(synthetic);
  cmd->add_option("--width-divisor", f->spec.width_divisor, "--synthetic: divide the widths by K (small test models)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->needs(synthetic);
  cmd->add_option("--json", f->json_path, "also write the results as JSON to this file");
  cmd->add_option("--record-routing", f->record_routing,
                  "write the routing counts of the batch-1 phase to this file (for --gpu-memory --routing-stats "
                  "or `spillway plan`)");
  cmd->add_option("--batches", f->batches, "batch sizes for aggregate decode")->delimiter(',')->capture_default_str();
  cmd->add_option("--prefill", f->prefill, "prompt lengths for prefill")->delimiter(',')->capture_default_str();
  cmd->add_option("--decode-steps", f->decode_steps, "timed batch-1 decode steps")->capture_default_str();
  cmd->add_option("--decode-context", f->decode_context, "prompt tokens before the batch-1 decode")
      ->capture_default_str();
  cmd->add_option("--batch-steps", f->batch_steps, "timed decode steps per batch size")->capture_default_str();
  cmd->add_option("--batch-prompt", f->batch_prompt_max, "batch prompts have max/4..max tokens")
      ->capture_default_str();
  cmd->add_option("--prefill-runs", f->prefill_runs, "timed runs per prefill length, after a warm-up chunk; the "
                                                     "median is reported")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--chunk", f->chunk, "prefill chunk (the budget's max_step_tokens)")->capture_default_str();
  cmd->add_option("--max-seqs", f->max_seqs, "KV budget sequences (0: the largest batch)")->capture_default_str();
  cmd->add_option("--max-context", f->max_context, "KV budget context (0: what the runs need)")
      ->capture_default_str();
  cmd->add_option("--project-layers", f->project_layers, "layers of the full model (0: 40 for V4.1, 43 for V4)")
      ->capture_default_str();
  cmd->add_option("--copy-mib", f->copy_mib, "MiB per bandwidth copy (>= 1024)")
      ->check(CLI::Range(1024, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "random token ids (and --synthetic's weights)")->capture_default_str();
  add_placement_flags(cmd, f->placement);
  cmd->add_flag("--plan-only", f->plan_only, "print the memory plan and per-token costs; no GPU needed");
  cmd->add_flag("--batch-invariant", f->batch_invariant,
                "decode and prefill as `serve --batch-invariant true` (its default) does: decode linears on the "
                "GEMV, EXL3 experts of decodes on the grouped kernel's one-token class, a batch in one call, prompt "
                "chunks shorter than 128 tokens on the row-invariant prefill path (without it: the fastest path per "
                "batch)");
  return [f] { return run_bench(*f); };
}

}  // namespace spw::cli
