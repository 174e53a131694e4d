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
// depend on the thread count or on how the experts are grouped.
//
// Streaming (bounded memory): the forward is layer-major. Every row's step is advanced through layer l (its
// weights loaded, then dropped) before layer l + 1, so one layer's weights are in memory at a time (the model-wide
// embedding and head stay), next to every row's residual streams and attention state. The routed experts are not
// part of that: the rows' MoE runs in batches (Model::run_layer_batch) and each expert is dequantized from the
// checkpoint when it is used, a thread's worth at a time. A collected layer's FFN
// inputs are kept for all calibration tokens; its Hessians are accumulated for `expert_group` experts at a time
// and streamed to one file per layer (hessian_file.h), so the accumulators in memory are one group's. The caller
// quantizes each layer from its file before the forward moves on (collect_hessians' on_layer).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/safetensors.h"
#include "model/config.h"

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
  std::vector<int> layers;  // which layers to collect (others only run); the forward stops after the last
  int expert_group = 0;     // experts whose accumulators are in memory at once; 0 = all of the layer's
  // Forward progress in token-layers: every row through one layer adds its tokens.
  std::function<void(int64_t done, int64_t total)> on_progress;
};

// What the streamed calibration holds in memory, in bytes (the plan and --calibration-memory use it).
struct CalibrationMemory {
  uint64_t model_wide = 0;     // fp32 embedding, head, final norms (Engram tables stay memory-mapped)
  uint64_t largest_layer = 0;  // fp32 weights of the largest layer without its routed experts (one layer at a time)
  uint64_t expert_values = 0;  // routed experts dequantized at once: one per thread, each freed after use
  uint64_t row_state = 0;      // every row's residual streams and per-layer attention state, the MoE batch's buffers
  uint64_t layer_inputs = 0;   // one layer's FFN inputs for every calibration token
  uint64_t layer_hessian = 0;  // the layer-wide gate/up accumulator (every token)
  uint64_t per_expert = 0;     // one expert's accumulators while its group is collected
  uint64_t fixed() const {
    return model_wide + largest_layer + expert_values + row_state + layer_inputs + layer_hessian;
  }
};
// threads: the calibration's worker count (global_pool().size()).
CalibrationMemory calibration_memory(const ModelConfig& config, const Checkpoint& checkpoint, int64_t calibration_tokens,
                                     int row_tokens, bool gate_up_shared, int threads);

// Runs the streamed calibration forward over `rows` up to the last of options.layers. For each of those layers
// (ascending), writes its Hessians to hessian_path(layer) (hessian_file.h format), then calls on_layer(layer),
// where the caller may quantize the layer, before the forward goes on. Errors: the model's, I/O, on_layer's.
Status collect_hessians(const std::string& model_dir, const CalibrationRows& rows, const HessianOptions& options,
                        const std::function<std::string(int layer)>& hessian_path,
                        const std::function<Status(int layer)>& on_layer);

}  // namespace spw::quant
