// `spillway quantize`: calibrated EXL3 quantization of a checkpoint's routed experts into a pack
// Spillway (and exllamav3-style readers) load. Everything else is copied unchanged.
//
// Pack layout (DST):
//   model-00001-of-N.safetensors         every non-expert tensor (and unselected experts), verbatim
//   model-0000{2..N}-of-N.safetensors    one shard per quantized layer: E.w{1,2,3}.{trellis,suh,svh,mul1|mcg}
//   model.safetensors.index.json         weight_map of every tensor
//   config.json                          source config with quantization_config (spec exl3.md §1.5)
//   quantization_config.json             the same plus tensor_storage per quantized module
//   quantize_report.json                 per-tensor proxy error, kept sigma_reg, tokens, seconds (not part of the resume identity)
//   tokenizer and other source files     copied
//   .quantize-work/                      resume state: settings fingerprint, finished layers' reports,
//                                        Hessians (deleted when the pack is complete unless keep_hessians)
// Resume: a layer whose shard and report exist is skipped; a rerun with the same settings writes
// byte-identical files (the trellis search, scales and Hessians are deterministic and
// thread-count independent). A rerun with other settings into the same DST is an error.
// Errors (all typed, nothing aborts): bad bits/codebook, missing calibration file, missing or
// malformed expert tensors, an unwritable or too-full output directory, I/O failures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace spw::quant {

struct QuantizeModelOptions {
  std::string model_dir, out_dir, calibration;
  int bits = 0;
  std::string codebook = "mul1";
  std::string device = "cpu";  // cpu | cuda (built with SPILLWAY_CUDA): where each tensor is quantized
  int64_t calibration_tokens = 16384;
  int row_tokens = 512;
  bool identity_hessian = false;
  bool single_candidate = false;     // one regularisation strength, no per-tensor search (exl3_quantize.h)
  bool routing_weighted = false;
  bool gate_up_shared = false;
  double prior_tokens = 256;
  // H_ii += sigma_reg · mean(diag H) before the LDL, in every candidate (QuantizeParams::sigma_reg, whose
  // 0.025 is exllamav3's). 1.0 here because a calibration Hessian is a noisy, domain-shifted estimate of the
  // activations the pack will see, and LDLQ with light damping piles error into the directions calibration
  // rarely visits: on the demo model (all 10 layers, K = 3, 16k held-out tokens) σ = 0.025 made the calibrated
  // pack only −1.3 % in KL against an identity-Hessian pack (t = −0.9), σ = 0.3 −6.8 % (t = −6.2), σ = 1
  // −9.9 % (t = −8.2), with lower tails too (bench/results/quantize_demo.md).
  double sigma_reg = 1.0;
  int prior_sample_tokens = 1024;
  // Memory for the calibration's Hessians, in GiB; 0 = 80 % of physical RAM less the reference forward's fp32
  // weights. The layers are calibrated in groups that fit it, one forward pass per group.
  double calibration_memory_gib = 0;
  bool dry_run = false;
  int threads = 0;
  uint64_t seed = 0;
  std::vector<int> layers, experts;  // empty = all
  int max_layers = -1;               // quantize at most this many pending layers, then stop (resume tests)
  bool keep_hessians = false;
  std::string dump_wh_dir;
  int dump_wh_count = 6;
  bool progress = true;
};

struct QuantizeModelResult {
  bool complete = false;
  int layers_quantized = 0, layers_skipped = 0;
  int tensors = 0;
  double mean_proxy_err = 0;
};

Result<QuantizeModelResult> quantize_model(const QuantizeModelOptions& options);

// Mean KL(P‖Q) and top-1 agreement of next-token distributions of two models over the same
// token rows (rows of row_tokens from a text file, evenly spaced, max_tokens in all).
struct KlResult {
  double mean_kl = 0;
  // Standard error of mean_kl from the spread of the per-row means (rows are independent slices
  // of the text; positions within a row are not). row_kl: those per-row means, for paired
  // comparisons of two packs on the same rows.
  double mean_kl_stderr = 0;
  std::vector<double> row_kl;
  double top1_agreement = 0;
  int64_t positions = 0;
  double ppl_p = 0, ppl_q = 0;  // perplexity of each model on the same positions
  // Per predicted position, rows in order: KL(P‖Q) and whether the argmaxes agree (paired
  // comparisons across packs: tools/quantize/paired_kl.py).
  std::vector<double> position_kl;
  std::vector<uint8_t> position_agree;
  std::vector<int32_t> position_row;  // the row each position belongs to
};
// One pass of P over the text, compared with each of `models_q` on the same positions (P's
// forward runs once). `batch` rows go through forward_batch together. Shard i of n takes rows
// i, i + n, ... only (run n processes side by side; position_row keeps the global row number).
Result<std::vector<KlResult>> eval_kl(const std::string& model_p, const std::vector<std::string>& models_q,
                                      const std::string& text_path, int64_t max_tokens, int row_tokens, int batch = 8,
                                      int shard = 0, int n_shards = 1);

}  // namespace spw::quant
