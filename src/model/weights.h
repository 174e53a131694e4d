// The model's weights in memory, loaded from a released checkpoint (specs §2).
// Quantized weights are dequantized exactly at load (e4m3·2^k and e2m1·2^k are exact in f32);
// each Linear remembers its storage format because the reference quantizes the activation
// before FP8/FP4 products and keeps FP32 products in FP32 (specs §3 "Linear dispatch").
// Engram tables stay in the memory map (they are 90+ GiB in the real model); rows are
// dequantized when gathered.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/safetensors.h"
#include "model/config.h"

namespace spw {

enum class LinearKind { Fp8, Fp4, Bf16, F32 };

struct Linear {
  std::vector<float> w;  // [n_out, n_in], row-major
  int n_out = 0, n_in = 0;
  LinearKind kind = LinearKind::Bf16;
  // Where the checkpoint stores it: "<stem>.weight" (+ "<stem>.scale", or the EXL3 tensors under the
  // stem). The loader below is the one place that names checkpoint tensors; the GPU uploader
  // (engine/device_weights.cpp) reads the stored bytes back through this.
  std::string stem;
  bool empty() const { return w.empty(); }
};

struct Expert {
  Linear w1, w2, w3;  // gate [d_expert, d], down [d, d_expert], up [d_expert, d]
};

struct HcWeights {
  std::vector<float> fn, base, scale;  // [(2+hc)·hc, hc·d], [(2+hc)·hc], [3]
};

struct EngramWeights {
  const TensorInfo* table = nullptr;        // F8_E4M3 [rows, head_dim]
  const TensorInfo* table_scale = nullptr;  // F8_E8M0 [rows, head_dim/32]
  Linear wkv;                               // [(hc+1)·d, n_rows_per_token·head_dim]
  std::vector<float> q_weight, k_weight;    // [hc, d]
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  Linear wq_a, wq_b, wkv, wo_a, wo_b;
  std::vector<float> q_norm, kv_norm, attn_sink;
  // Compressor (V4 CSA/HCA; V4.1 KV sources).
  Linear comp_wkv, comp_wgate;
  std::vector<float> comp_ape, comp_norm;
  // Indexer (V4 CSA; V4.1 index sources).
  Linear idx_wq_b, idx_weights_proj;
  Linear idx_comp_wkv, idx_comp_wgate;  // V4: the indexer's own compressor
  std::vector<float> idx_comp_ape, idx_comp_norm;
  Linear idx_wk;                         // V4.1 KV sources: keys from the latent
  std::vector<float> idx_k_norm;
  // MoE.
  Linear gate;  // F32 router
  std::vector<float> gate_bias, gate_bias_vl;
  std::vector<int32_t> tid2eid;  // [vocab, top_k] on hash layers
  std::vector<Expert> experts;
  Expert shared;
  EngramWeights engram;

  // Every layer has norms; an empty one is a layer that is not loaded (LoadOptions::layer_weights = false).
  bool loaded() const { return !attn_norm.empty(); }
};

struct ModelWeights {
  Checkpoint checkpoint;  // keeps the memory maps alive
  std::vector<float> embed;  // [vocab, d]
  Linear head;               // F32 [vocab, d]
  std::vector<float> norm;
  HcWeights hc_head;         // V4 only
  std::vector<LayerWeights> layers;
  std::vector<int32_t> engram_token_map;  // V4.1: token id → compressed id
};

struct LoadOptions {
  // Called after each layer with (layers done, layers total); for progress display.
  std::function<void(int, int)> on_progress;
  // false: routed experts are checked (names, dtypes, shapes) but not dequantized; each expert Linear
  // keeps n_out, n_in and kind with w empty. For the GPU engine, which uploads the stored bytes: a
  // full-width V4.1 layer's experts are 54 GB as f32, and decoding EXL3 on the CPU takes minutes.
  bool routed_expert_values = true;
  // false: FP8 linears (except wo_a, used as BF16) and BF16/F32 linears are checked but keep no f32 values (w
  // empty, the stored bytes stay in the checkpoint). For the GPU engine, which uploads the stored bytes: a
  // full-width V4.1's dense f32 copies are ~30 GB and take minutes to dequantize on one core.
  bool dense_values = true;
  // false: only the model-wide tensors (embedding, head, final norms, Engram token map); every layer stays
  // empty until load_layer_weights fills it. For callers that stream the model a layer at a time (calibration
  // of a checkpoint larger than RAM); such a load checks no layer tensor up front.
  bool layer_weights = true;
};

// Loads and validates every tensor the forward needs: names with or without the "model."
// prefix, dtypes and shapes checked against the config; errors name the file and tensor.
Result<std::unique_ptr<ModelWeights>> load_weights(const std::string& model_dir, const ModelConfig& config,
                                                   const LoadOptions& options = {});
// The same from an open checkpoint (e.g. Checkpoint::in_memory); V4.1's Engram token map is its tensor
// "engram_token_map" when it has one, else the file engram_token_map.safetensors under its root.
Result<std::unique_ptr<ModelWeights>> load_weights(Checkpoint checkpoint, const ModelConfig& config,
                                                   const LoadOptions& options = {});

// Loads and validates one layer's tensors from w's checkpoint into w.layers[layer] (replacing what was there).
// On error w.layers[layer] is left as it was.
Status load_layer_weights(ModelWeights& w, const ModelConfig& config, int layer, const LoadOptions& options = {});

// One routed expert's values from w's checkpoint (MXFP4 or EXL3), for layers loaded with routed_expert_values =
// false: the forward and the calibration dequantize each expert when they use it (model/moe.cpp).
Result<Expert> load_routed_expert(const ModelWeights& w, const ModelConfig& config, int layer, int expert);

}  // namespace spw
