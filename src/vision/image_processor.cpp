// The V4.1 image processor (contract in image_processor.h). The plan follows the reference's float
// arithmetic step by step (Python floats are IEEE doubles; math.floor / math.ceil / int() as
// std::floor / std::ceil / truncation; ** 0.5 as std::pow) so sizes agree exactly at the rounding
// edges.
#include "vision/image_processor.h"

#include <algorithm>
#include <cmath>

#include "formats/dtypes.h"
#include "vision/pil_resize.h"

namespace spw::vision {
namespace {

constexpr uint8_t kPadGrey = 127;

struct LlmGrid {
  int n_h, n_w;
};

LlmGrid llm_grid(int64_t best_height, int64_t best_width, int patch, int ratio) {
  return {int(std::ceil(double(best_height / patch) / ratio)), int(std::ceil(double(best_width / patch) / ratio))};
}

// Largest aspect-preserving pixel size (height, width) whose token grid fits max_n_token.
std::pair<int64_t, int64_t> solve_resize_ratio(double height, double width, int patch, int ratio, int max_n_token) {
  const double r = height / width;
  const double max_w_float = std::sqrt(double(max_n_token - 2) / r + 0.25) - 0.5;
  const double max_h_float = max_w_float * r;
  const int64_t cell = int64_t(patch) * ratio;
  if (max_w_float < 1.0) return {int64_t((max_n_token - 2) / 2) * cell, cell};  // very tall: one column
  if (max_h_float < 1.0) return {cell, int64_t(max_n_token - 3) * cell};        // very wide: one row
  const double beta = std::min(double(int64_t(std::floor(max_w_float)) * cell) / width,
                               double(int64_t(std::floor(max_h_float)) * cell) / height);
  return {int64_t(std::floor(height * beta / patch)) * patch, int64_t(std::floor(width * beta / patch)) * patch};
}

// Python's round() of a double: nearest integer, ties to even.
int64_t round_half_even(double x) { return int64_t(std::nearbyint(x)); }

void paste(const RgbImage& src, int x0, int y0, RgbImage& dst) {
  for (int y = 0; y < src.height; ++y) std::copy_n(src.row(y), size_t(src.width) * 3, dst.row(y0 + y) + size_t(x0) * 3);
}

}  // namespace

int64_t num_image_tokens(int n_llm_h, int n_llm_w) { return int64_t(n_llm_h) * (n_llm_w + 1) + 2; }

Result<ImageGrid> plan_image_grid(int width_in, int height_in, const VisionConfig& cfg) {
  SPW_CHECK(width_in > 0 && height_in > 0);
  const int p = cfg.patch_size;
  double width = width_in, height = height_in;
  if (cfg.max_wh_ratio && width > height * *cfg.max_wh_ratio) width = height * *cfg.max_wh_ratio;
  if (width * height > 0 && width * height < double(cfg.min_pixels)) {
    const double ratio = std::pow(double(cfg.min_pixels) / (width * height), 0.5);
    width = std::trunc(width * ratio);
    height = std::trunc(height * ratio);
  }
  int64_t best_width = int64_t(std::ceil(width / p)) * p;
  int64_t best_height = int64_t(std::ceil(height / p)) * p;
  LlmGrid g = llm_grid(best_height, best_width, p, cfg.downsample_ratio);
  if (num_image_tokens(g.n_h, g.n_w) > cfg.max_image_tokens) {
    std::tie(best_height, best_width) = solve_resize_ratio(height, width, p, cfg.downsample_ratio, cfg.max_image_tokens);
    g = llm_grid(best_height, best_width, p, cfg.downsample_ratio);
    if (num_image_tokens(g.n_h, g.n_w) > cfg.max_image_tokens || best_width <= 0 || best_height <= 0) {
      return make_error("image of ", width_in, "x", height_in, " has no token grid within max_image_tokens ",
                        cfg.max_image_tokens, " under this vision config");
    }
  }
  ImageGrid out;
  out.best_width = int(best_width);
  out.best_height = int(best_height);
  out.n_vit_w = int(best_width / p);
  out.n_vit_h = int(best_height / p);
  out.n_llm_h = g.n_h;
  out.n_llm_w = g.n_w;
  out.n_tokens = num_image_tokens(g.n_h, g.n_w);
  return out;
}

RgbImage fit_to_canvas(const RgbImage& image, const ImageGrid& grid, const VisionConfig& cfg) {
  const int W = grid.best_width, H = grid.best_height;
  if (cfg.max_wh_ratio && image.width >= *cfg.max_wh_ratio * image.height) return resize_bicubic_pil(image, W, H);
  // ImageOps.contain: the largest size with the image's aspect ratio inside W x H.
  int64_t w = W, h = H;
  const double im_ratio = double(image.width) / image.height;
  const double dest_ratio = double(W) / H;
  if (im_ratio != dest_ratio) {
    if (im_ratio > dest_ratio) {
      h = round_half_even(double(image.height) / image.width * W);
    } else {
      w = round_half_even(double(image.width) / image.height * H);
    }
  }
  RgbImage canvas(W, H, kPadGrey);
  if (w == 0 || h == 0) return canvas;  // contain() gives an empty image: all padding
  const RgbImage resized = resize_bicubic_pil(image, int(w), int(h));
  if (w == W && h == H) return resized;
  // ImageOps.pad: centred along the padded axis, round() half to even.
  if (w != W) {
    paste(resized, int(round_half_even((W - w) * 0.5)), 0, canvas);
  } else {
    paste(resized, 0, int(round_half_even((H - h) * 0.5)), canvas);
  }
  return canvas;
}

Result<ProcessedImage> process_image(const RgbImage& image, const VisionConfig& cfg) {
  if (image.width <= 0 || image.height <= 0) return make_error("the image is empty; send an image with pixels");
  auto grid = plan_image_grid(image.width, image.height, cfg);
  if (!grid.ok()) return grid.error();
  ProcessedImage out;
  out.grid = grid.value();
  out.canvas = fit_to_canvas(image, out.grid, cfg);

  // The 256 byte values normalise to 256 bf16 values; torch computes x / 255 then (x - 0.5) / 0.5 in f32.
  uint16_t lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = f32_to_bf16((float(v) / 255.0f - 0.5f) / 0.5f);
  const int p = cfg.patch_size;
  const ImageGrid& g = out.grid;
  out.patches.resize(size_t(g.n_vit_h) * g.n_vit_w * 3 * p * p);
  uint16_t* dst = out.patches.data();
  for (int ph = 0; ph < g.n_vit_h; ++ph) {
    for (int pw = 0; pw < g.n_vit_w; ++pw) {
      for (int c = 0; c < 3; ++c) {
        for (int y = 0; y < p; ++y) {
          const uint8_t* src = out.canvas.row(ph * p + y) + size_t(pw) * p * 3 + c;
          for (int x = 0; x < p; ++x) *dst++ = lut[src[3 * x]];
        }
      }
    }
  }
  return out;
}

}  // namespace spw::vision
