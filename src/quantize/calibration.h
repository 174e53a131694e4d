// Calibration for `spillway quantize`: token rows from a calibration file, and the proxy
// Hessians of the routed experts collected on Spillway's own CPU forward (docs/quantize.md
// "Calibration policy").
//
// Which Hessian each expert projection gets (k×k, normalized by the token count):
//   w1/w3 (gate/up, per expert): Σ ω xxᵀ over the tokens routed to the expert, blended with the
//     layer's all-token Hessian by token count: (Σ ω xxᵀ + n0·H_layer) / (Σ ω + n0).
//     gate_up_shared = true instead gives every expert H_layer (exllamav3's choice).
//   w2 (down, per expert): Σ ω hhᵀ of the expert's SwiGLU output h on its routed tokens, blended
//     the same way with a prior made by running the expert on the layer's first
//     prior_sample_tokens tokens regardless of routing (exllamav3 activates all experts).
//   ω = 1, or the token's routing weight with routing_weighted. n0 = prior_tokens.
// An expert with no calibration tokens thus gets the prior; with n0 = 0 and no tokens it gets a
// zero Hessian, which the quantizer treats as uncalibrated (identity).
//
// Contract: the calibration forward uses reference numerics; the MoE input x is the "ffn.in"
// intermediate (ForwardOptions::on_intermediate), routing is recomputed from the same weights as
// model/moe.cpp does. Accumulation is in fp64, in token order per expert, so results do not
// depend on the thread count. Memory: all selected layers' accumulators at once,
// 8·(d² + n_experts·(d² + 2·d_expert²)) bytes per layer (no per-expert d² with gate_up_shared), plus the
// finished layers' outputs (8·n_experts·(d² + d_expert²) each); hessian_layer_bytes bounds one layer, and
// `spillway quantize` calls this for groups of layers that fit its memory budget. The forward itself holds the
// model in fp32 (the routing here reads the forward's copy).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace spw::quant {

struct CalibrationRows {
  std::vector<std::vector<int32_t>> rows;
  int64_t stream_tokens = 0;  // tokens in the whole file before sampling rows
  int n_documents = 0;
  int n_chat = 0;
};

// .jsonl: one JSON object per line, {"text": "..."} or an OpenAI chat body {"messages": [...]}
// (encoded with src/chat for the model's family, then tokenized with special tokens); any other
// file: plain UTF-8 text, one document. Documents are joined (BOS before each text document) and
// max_tokens are taken as rows of row_tokens, evenly spaced over the whole stream.
Result<CalibrationRows> load_calibration_rows(const std::string& model_dir, const std::string& path,
                                              int64_t max_tokens, int row_tokens);

struct HessianOptions {
  bool routing_weighted = false;
  bool gate_up_shared = false;
  double prior_tokens = 256;
  int prior_sample_tokens = 1024;
  std::vector<int> layers;  // which layers to collect (others skipped)
  std::function<void(int64_t tokens_done, int64_t tokens_total)> on_progress;
};

struct LayerHessians {
  int layer = 0, d = 0, f = 0;
  std::vector<std::vector<double>> w13, w2;  // per expert, [d][d] and [f][f], normalized and blended
  std::vector<double> tokens;                // per expert: Σ ω over routed tokens
  double layer_tokens = 0;
};

// Peak bytes one selected layer adds to collect_hessians: its accumulators plus its output.
uint64_t hessian_layer_bytes(int d, int d_expert, int n_experts, bool gate_up_shared);

Result<std::vector<LayerHessians>> collect_hessians(const std::string& model_dir, const CalibrationRows& rows,
                                                    const HessianOptions& options);

// One layer's Hessians as F64 tensors "w13.E" [d, d], "w2.E" [f, f], "tokens" [n_experts],
// "layer_tokens" [1] (also the --dump-wh H format, docs/quantize.md).
Status save_layer_hessians(const std::string& path, const LayerHessians& h);
Result<LayerHessians> load_layer_hessians(const std::string& path, int layer);

}  // namespace spw::quant
