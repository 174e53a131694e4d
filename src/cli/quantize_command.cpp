// `spillway quantize`: calibrated EXL3 quantization of the routed experts (docs/quantize.md), and
// `spillway kl` (alias `eval-kl`): KL / top-1 agreement of quantized packs against their source model.
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
                "quantize each tensor once (then polished) instead of keeping the best of 4 candidates (signs, global scales)");
  cmd->add_flag("--routing-weighted", o->routing_weighted, "weight each routed token's Hessian term by its routing weight");
  cmd->add_flag("--gate-up-shared", o->gate_up_shared, "one gate/up Hessian per layer (all tokens) instead of per expert");
  cmd->add_option("--prior-tokens", o->prior_tokens, "blend weight n0 of the per-layer prior, in tokens")->capture_default_str();
  cmd->add_option("--sigma-reg", o->sigma_reg,
                  "Hessian damping: H_ii += sigma_reg * mean(diag H) before LDLQ; larger trusts the calibration less (exllamav3 uses 0.025; docs/quantize.md)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--prior-sample-tokens", o->prior_sample_tokens,
                  "tokens per layer on which every expert runs to form the down-projection prior")->capture_default_str();
  cmd->add_option("--calibration-memory", o->calibration_memory_gib,
                  "GiB for the Hessian accumulators (0 = 80% of RAM less the streamed forward's own memory, which the "
                  "plan prints); each layer's experts are calibrated in groups that fit")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
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

std::function<int()> add_kl_command(CLI::App& app) {
  struct Opts {
    std::string p, text, per_position;
    std::vector<std::string> q;
    int64_t tokens = 4096;
    int row = 256;
    int threads = 0;
    int batch = 8;
    std::string shard = "0/1";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("kl", "KL(P‖Q) and top-1 agreement of models against a reference on the same text");
  cmd->alias("eval-kl");  // the command's former name, kept for existing scripts
  cmd->add_option("--model", o->p, "reference model P (e.g. the source)")->required();
  cmd->add_option("--quantized", o->q, "model(s) Q (e.g. quantized packs; P runs once for all)")->required();
  cmd->add_option("--text", o->text, "held-out text (.txt) or .jsonl")->required();
  cmd->add_option("--tokens", o->tokens, "tokens in all")->capture_default_str();
  cmd->add_option("--row", o->row, "tokens per row")->capture_default_str();
  cmd->add_option("--batch", o->batch, "rows per forward_batch")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)");
  cmd->add_option("--shard", o->shard, "I/N: only rows I, I+N, ... (N processes side by side)")->capture_default_str();
  cmd->add_option("--per-position", o->per_position,
                  "write row, position, then KL and top-1 agreement per model, one predicted position a line (TSV)");
  return [o] {
    if (o->threads > 0) set_global_pool_threads(size_t(o->threads));
    int shard = 0, n_shards = 1;
    if (std::sscanf(o->shard.c_str(), "%d/%d", &shard, &n_shards) != 2) {
      std::fprintf(stderr, "error: --shard wants I/N, got %s\n", o->shard.c_str());
      return 1;
    }
    auto r = quant::eval_kl(o->p, o->q, o->text, o->tokens, o->row, o->batch, shard, n_shards);
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", r.error().message.c_str());
      return 1;
    }
    for (size_t qi = 0; qi < r->size(); ++qi) {
      const quant::KlResult& k = (*r)[qi];
      if (r->size() > 1) std::printf("%s: ", o->q[qi].c_str());
      std::printf("positions %lld  mean_kl %.6f  top1_agreement %.4f  ppl_p %.3f  ppl_q %.3f  kl_stderr %.6f  row_kl",
                  (long long)k.positions, k.mean_kl, k.top1_agreement, k.ppl_p, k.ppl_q, k.mean_kl_stderr);
      for (double x : k.row_kl) std::printf(" %.6f", x);
      std::printf("\n");
    }
    if (!o->per_position.empty()) {
      FILE* f = std::fopen(o->per_position.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "error: cannot write %s\n", o->per_position.c_str());
        return 1;
      }
      std::fprintf(f, "row\tpos");
      for (const auto& q : o->q) std::fprintf(f, "\tkl:%s\tagree:%s", q.c_str(), q.c_str());
      std::fprintf(f, "\n");
      // Every Q has the same positions in the same order.
      const quant::KlResult& k0 = r->front();
      for (size_t at = 0, pos = 0; at < k0.position_kl.size(); ++at) {
        pos = at > 0 && k0.position_row[at] == k0.position_row[at - 1] ? pos + 1 : 0;
        std::fprintf(f, "%d\t%zu", k0.position_row[at], pos);
        for (const auto& k : *r) std::fprintf(f, "\t%.9g\t%d", k.position_kl[at], int(k.position_agree[at]));
        std::fprintf(f, "\n");
      }
      if (std::fclose(f) != 0) {
        std::fprintf(stderr, "error: writing %s failed\n", o->per_position.c_str());
        return 1;
      }
    }
    return 0;
  };
}

}  // namespace spw::cli
