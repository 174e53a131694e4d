// The vision tower's settings from a checkpoint's config.json: the nested HF form
// (`vision_config` {num_hidden_layers, hidden_size, num_attention_heads, intermediate_size,
// patch_size, rope_theta, downsample_ratio, max_image_tokens, min_pixels, max_wh_ratio}, plus the
// top-level `image_token_id`) or the reference's flat inference/config.json (`vision_n_layers`,
// `vision_dim`, ..., `vision_max_n_token`, `vision_min_pixels`, `vision_max_wh_ratio`); specs §1.2.
// A model takes images only when it has a vision tower (n_layers > 0), as in the reference.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace spw::vision {

struct VisionConfig {
  int n_layers = 32;
  int d_model = 1024;
  int n_heads = 16;
  int d_inter = 2816;
  int patch_size = 14;
  double rope_theta = 10000;
  int downsample_ratio = 3;           // the aligner's unfold: ratio x ratio patches per LLM token
  int max_image_tokens = 1024;        // LLM positions per image, START / NEW_LINE / END included
  int64_t min_pixels = 544 * 544;     // smaller images are scaled up to about this area
  std::optional<double> max_wh_ratio;  // null in the released config
  int64_t image_token_id = 129264;    // the id every position of an image span carries
};

// nullopt when the config describes no vision tower (no vision settings, or zero layers). An Error
// names `source` and the field when a value is missing, mistyped or outside what the processor
// supports.
Result<std::optional<VisionConfig>> parse_vision_config(const nlohmann::json& config, const std::string& source);
// Reads <dir>/config.json (or a config.json path).
Result<std::optional<VisionConfig>> read_vision_config(const std::string& path);

}  // namespace spw::vision
