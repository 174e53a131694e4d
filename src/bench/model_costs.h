// What one token costs a DeepSeek-V4 / V4.1 checkpoint, for `spillway bench`: the bytes a
// batch-1 decode token must read (the roofline numerator) and the FLOPs of one prefill token (the
// tensor-core numerator). Pure host arithmetic over the checkpoint's tensor headers (works on
// header-only checkpoints) and the config.
//
// Decode bytes are counted in the checkpoint's storage formats (FP8 + scales, MXFP4 + scales, EXL3
// trellis + suh/svh, BF16, F32): the least a kernel can read. Where the engine uploads a weight wider
// (wo_a as BF16, the embedding as F32) that is the engine's cost, not the roofline's. Per layer: every
// non-expert tensor (attention, compressor and indexer, router, shared expert, mHC, norms, Engram
// projections), top_k routed experts (mean expert size of the layer), one tid2eid row on hash layers;
// plus the embedding row, the final norm, the V4 head mHC and the whole head; plus the KV rows read at
// context T (kv_read_nbytes). Engram table rows are read from host memory: reported apart, not in HBM.
//
// Prefill FLOPs per token, averaged over the positions 0..P-1 of a P-token prompt: 2 × the weights of
// every linear a token goes through (dense linears incl. mHC mixes and the router, top_k experts, the
// shared expert, Engram's projection), the attention products (QK and PV over the window and the
// selected compressed entries) and the indexer scores (over all visible index keys; V4.1 re-index
// layers only inside the candidate blocks). The head runs for the last position only and is left out.
// Tests: none of its own (exercised by `spillway bench --plan-only` in tests/python/test_synth_model.py).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "model/config.h"

namespace spw::bench {

struct LayerBytes {
  int64_t dense = 0;          // non-expert weights read per token (incl. shared expert, router)
  int64_t shared = 0;         // of which the shared expert
  int64_t routed = 0;         // top_k experts
  int64_t expert = 0;         // one routed expert (mean over the layer's experts)
  int64_t engram_host = 0;    // Engram table rows (host memory)
};

struct DecodeBytes {
  std::vector<LayerBytes> layers;
  int64_t embed_row = 0, head = 0, final_other = 0;  // final_other: final norm, V4 head mHC
  std::map<std::string, int64_t> dense_by_role;      // all layers, by tensor_role()
  int64_t layer_total() const;                       // dense + routed of every layer
  int64_t fixed_total() const { return embed_row + head + final_other; }
  int64_t weights_total() const { return layer_total() + fixed_total(); }
  int64_t engram_host_total() const;
};

DecodeBytes decode_bytes(const Checkpoint& ckpt, const ModelConfig& c);

// KV bytes one decode token reads per layer at context n_ctx (window rows, the top-k or all
// compressed entries, every visible index key), from the engine's compact row sizes.
std::vector<int64_t> kv_read_nbytes(const ModelConfig& c, int64_t n_ctx);

struct PrefillFlops {
  double linear = 0, routed = 0, attention = 0, indexer = 0;  // per token, averaged over the prompt
  double total() const { return linear + routed + attention + indexer; }
};

PrefillFlops prefill_flops(const Checkpoint& ckpt, const ModelConfig& c, int64_t prompt_len);

}  // namespace spw::bench
