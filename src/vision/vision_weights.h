// The V4.1 vision tower's and aligner's weights (specs §2.3, §5.6), widened to f32 at load.
// Tensor names and roles (every one BF16 or F32 on disk; d = hidden_size, r = downsample_ratio,
// P = 3·patch_size², D = the LLM's hidden size):
//   vision.patch_embed.proj.{weight [d, P], bias [d]}     patch embedding
//   vision.blocks.<b>.norm1.weight [d], norm2.weight [d]   pre-norms (RMSNorm, eps 1e-6)
//   vision.blocks.<b>.attn.wqkv.{weight [3d, d], bias}    fused q | k | v, each [n_heads, d_head]
//   vision.blocks.<b>.attn.wo.{weight [d, d], bias [d]}
//   vision.blocks.<b>.mlp.w1.weight [2·d_inter, d]         fused gate | up, no bias
//   vision.blocks.<b>.mlp.w2.weight [d, d_inter]           no bias
//   vision.norm.weight [d]                                 final RMSNorm
//   aligner.w1.{weight [D, r²·d], bias [D]}, aligner.w2.{weight [D, D], bias [D]}
//   image_start, image_end, image_newline [D]              the span's learned vectors
// Names are looked up with or without the "model." prefix, as the text weights are. This file is the
// one place that names vision tensors; the text loader (model/weights.cpp) ignores them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/safetensors.h"
#include "vision/vision_config.h"

namespace spw::vision {

struct VitBlockWeights {
  std::vector<float> norm1, norm2;       // [d]
  std::vector<float> wqkv, wqkv_bias;    // [3d, d], [3d]
  std::vector<float> wo, wo_bias;        // [d, d], [d]
  std::vector<float> w1;                 // [2·d_inter, d]: rows [0, d_inter) gate, then up
  std::vector<float> w2;                 // [d, d_inter]
};

struct VisionWeights {
  VisionConfig config;
  int d_llm = 0;  // the aligner's output width (the LLM's hidden size)
  std::vector<float> patch_embed, patch_embed_bias;  // [d, 3·p²], [d]
  std::vector<VitBlockWeights> blocks;
  std::vector<float> norm;                            // [d]
  std::vector<float> aligner_w1, aligner_w1_bias;     // [D, r²·d], [D]
  std::vector<float> aligner_w2, aligner_w2_bias;     // [D, D], [D]
  std::vector<float> image_start, image_end, image_newline;  // [D]
};

// An Error when the config cannot describe this tower: d_model not a multiple of n_heads, or a
// d_head not a multiple of 4 (the 2-D RoPE splits each head's rotated half between rows and columns).
Status check_vision_shapes(const VisionConfig& config);

// nullopt when the checkpoint holds no vision tensor at all (a text-only model). Otherwise every
// tensor above must be present with the shape `config` and `d_llm` imply; an Error names the file,
// the tensor, its shape and the expected one.
Result<std::optional<VisionWeights>> load_vision_weights(const Checkpoint& checkpoint, const VisionConfig& config,
                                                         int d_llm);
// Opens the checkpoint at `model_dir` (as Checkpoint::open) and loads as above.
Result<std::optional<VisionWeights>> load_vision_weights(const std::string& model_dir, const VisionConfig& config,
                                                         int d_llm);

}  // namespace spw::vision
