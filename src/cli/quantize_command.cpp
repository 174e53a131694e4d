// `spillway quantize`: calibrated EXL3 quantization of the routed experts (docs/quantize.md), and
// `spillway eval-kl`: KL / top-1 agreement of a quantized pack against its source model.
#include <cstdio>
#include <memory>

#include "base/log.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "quantize/quantize_model.h"

namespace spw::cli {

std::function<int()> add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<quant::QuantizeModelOptions>();
  auto no_progress = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("quantize", "Quantize a checkpoint's routed experts to EXL3 (calibrated)");
  cmd->add_option("--model", o->model_dir, "source model directory")->required();
  cmd->add_option("--out", o->out_dir, "output directory for the pack (resumes if it holds a partial run)")->required();
  cmd->add_option("--bits", o->bits, "EXL3 bits per weight K (integer 1..8)")->required();
  cmd->add_option("--codebook", o->codebook, "mul1, mcg or 3inst")->capture_default_str();
  cmd->add_option("--device", o->device, "cpu or cuda (quantize each tensor on the GPU; CUDA builds)")
      ->capture_default_str();
  cmd->add_option("--calibration", o->calibration, "calibration text (.txt) or .jsonl of {text} / {messages}");
  cmd->add_option("--calibration-tokens", o->calibration_tokens, "calibration tokens in all")->capture_default_str();
  cmd->add_option("--calibration-row", o->row_tokens, "tokens per calibration row")->capture_default_str();
  cmd->add_flag("--identity-hessian", o->identity_hessian, "uncalibrated: H = I (no calibration file needed)");
  cmd->add_flag("--single-candidate", o->single_candidate,
                "quantize each tensor once instead of keeping the best of 4 candidates (regularisation strengths, signs)");
  cmd->add_flag("--routing-weighted", o->routing_weighted, "weight each routed token's Hessian term by its routing weight");
  cmd->add_flag("--gate-up-shared", o->gate_up_shared, "one gate/up Hessian per layer (all tokens) instead of per expert");
  cmd->add_option("--prior-tokens", o->prior_tokens, "blend weight n0 of the per-layer prior, in tokens")->capture_default_str();
  cmd->add_option("--prior-sample-tokens", o->prior_sample_tokens,
                  "tokens per layer on which every expert runs to form the down-projection prior")->capture_default_str();
  cmd->add_flag("--dry-run", o->dry_run, "print the plan (tensors, estimated time, output size) and exit");
  cmd->add_option("--threads", o->threads, "worker threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the random Hadamard signs")->capture_default_str();
  cmd->add_option("--layers", o->layers, "only these layers (default all)")->delimiter(',');
  cmd->add_option("--experts", o->experts, "only these experts (default all; others stay in the source format)")->delimiter(',');
  cmd->add_option("--max-layers", o->max_layers, "stop after quantizing this many layers (resume later)");
  cmd->add_flag("--keep-hessians", o->keep_hessians, "keep .quantize-work/hessians after the pack is complete");
  cmd->add_option("--dump-wh", o->dump_wh_dir, "write W, H and Spillway's result for a few tensors here (docs/quantize.md)");
  cmd->add_option("--dump-wh-count", o->dump_wh_count, "how many tensors --dump-wh writes")->capture_default_str();
  cmd->add_flag("--no-progress", *no_progress, "no progress bar");
  return [o, no_progress] {
    o->progress = !*no_progress;
    if (o->threads > 0) set_global_pool_threads(size_t(o->threads));
    auto r = quant::quantize_model(*o);
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", r.error().message.c_str());
      return 1;
    }
    if (!o->dry_run && r->complete) std::fprintf(stderr, "done: %s\n", o->out_dir.c_str());
    return r->complete || o->dry_run ? 0 : 3;
  };
}

std::function<int()> add_eval_kl_command(CLI::App& app) {
  struct Opts {
    std::string p, q, text;
    int64_t tokens = 4096;
    int row = 256;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("eval-kl", "KL(P‖Q) and top-1 agreement of two models on the same text");
  cmd->add_option("--model", o->p, "reference model P (e.g. the source)")->required();
  cmd->add_option("--quantized", o->q, "model Q (e.g. a quantized pack)")->required();
  cmd->add_option("--text", o->text, "held-out text (.txt) or .jsonl")->required();
  cmd->add_option("--tokens", o->tokens, "tokens in all")->capture_default_str();
  cmd->add_option("--row", o->row, "tokens per row")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)");
  return [o] {
    if (o->threads > 0) set_global_pool_threads(size_t(o->threads));
    auto r = quant::eval_kl(o->p, o->q, o->text, o->tokens, o->row);
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", r.error().message.c_str());
      return 1;
    }
    std::printf("positions %lld  mean_kl %.6f  top1_agreement %.4f  ppl_p %.3f  ppl_q %.3f  kl_stderr %.6f  row_kl",
                (long long)r->positions, r->mean_kl, r->top1_agreement, r->ppl_p, r->ppl_q, r->mean_kl_stderr);
    for (double k : r->row_kl) std::printf(" %.6f", k);
    std::printf("\n");
    return 0;
  };
}

}  // namespace spw::cli
