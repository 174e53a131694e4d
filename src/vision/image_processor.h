// The DeepSeek-V4.1 image processor, as the reference defines it (inference/image_processor.py of
// deepseek-ai/DeepSeek-V4.1-Flash @ dba1be0a; specs §5.6):
//   1. plan: scale the original size up to about min_pixels when smaller (int() truncation), round
//      each side up to a multiple of patch_size, and when the aligner's token grid
//      (ceil((side / patch) / downsample)) would cost more than max_image_tokens, solve for the
//      largest aspect-preserving size that fits (collapsing to one column or row for extreme
//      aspect ratios);
//   2. fit: Pillow's ImageOps.pad onto a best_width x best_height canvas of grey 127: a bicubic
//      resize keeping the aspect ratio (Python round(), half to even), centred; with max_wh_ratio set
//      and the image at least that wide, a plain bicubic resize instead;
//   3. normalise (x / 255 - 0.5) / 0.5 in f32, round to bf16, and cut 14x14 patches in (channel,
//      row, col) order, patches in row-major grid order.
// The ViT sees n_vit_h x n_vit_w patches; the LLM sees the n_llm_h x n_llm_w grid after the 3x3
// unfold, laid out as image_tokens.h describes.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "vision/image.h"
#include "vision/vision_config.h"

namespace spw::vision {

struct ImageGrid {
  int best_width = 0, best_height = 0;  // canvas size in pixels, multiples of patch_size
  int n_vit_h = 0, n_vit_w = 0;         // ViT patch grid
  int n_llm_h = 0, n_llm_w = 0;         // LLM token grid after the aligner
  int64_t n_tokens = 0;                 // positions of the image span: n_llm_h * (n_llm_w + 1) + 2
};

struct ProcessedImage {
  ImageGrid grid;
  RgbImage canvas;  // the padded best_width x best_height image the patches are cut from
  // [n_vit_h * n_vit_w][3][patch][patch] bf16 bits: the ViT's input.
  std::vector<uint16_t> patches;
};

// LLM positions of an image span with this token grid.
int64_t num_image_tokens(int n_llm_h, int n_llm_w);
// The plan for an image of this original size (both > 0): a pure function, like the reference's
// plan_image_grid. An Error only for configs the reference would trip its own assertion on.
Result<ImageGrid> plan_image_grid(int width, int height, const VisionConfig& config);
// Steps 2 and 3 for a decoded image.
Result<ProcessedImage> process_image(const RgbImage& image, const VisionConfig& config);
// Step 2 alone: the canvas of `grid` (exposed for the golden tests).
RgbImage fit_to_canvas(const RgbImage& image, const ImageGrid& grid, const VisionConfig& config);

}  // namespace spw::vision
