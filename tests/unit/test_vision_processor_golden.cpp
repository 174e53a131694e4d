// The C++ image processor (src/vision/image_processor.h) against the DeepSeek-V4.1 reference
// processor run with Pillow by tools/vision/make_processor_goldens.py, on 20 synthetic images
// from 1x1 to 10000x1 and 4000x3000, under the released vision_config and two small variants.
//
// Tolerance: none. The grid plan is the same double arithmetic; the resize reimplements Pillow's
// integer bicubic (pil_resize.h), so the canvas must hash identically; the patch values are a
// pure function of the canvas bytes (f32 arithmetic as torch does it, bf16 round-to-nearest-even).
// On a hash mismatch the test still reports the sampled pixels' largest difference and the
// channel-sum differences, to tell a rounding slip (±1) from a layout error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "vision/image_processor.h"
#include "vision_synth.h"

namespace spw::vision {
namespace {

using nlohmann::json;

VisionConfig config_from(const json& c) {
  VisionConfig cfg;
  cfg.patch_size = c["patch_size"];
  cfg.downsample_ratio = c["downsample_ratio"];
  cfg.max_image_tokens = c["max_image_tokens"];
  cfg.min_pixels = c["min_pixels"];
  if (!c["max_wh_ratio"].is_null()) cfg.max_wh_ratio = c["max_wh_ratio"].get<double>();
  return cfg;
}

TEST(VisionProcessorGolden, MatchesReferenceOnTwentyImages) {
  const json goldens = json::parse(test::read_file(test::kVisionData + "processor_goldens.json"));
  ASSERT_EQ(goldens["cases"].size(), 20u);
  for (const json& c : goldens["cases"]) {
    const int w = c["width"], h = c["height"];
    SCOPED_TRACE(std::to_string(w) + "x" + std::to_string(h));
    const VisionConfig cfg = config_from(c["config"]);
    auto out = process_image(test::synth_image(w, h, c["seed"].get<uint32_t>()), cfg);
    ASSERT_TRUE(out.ok()) << out.error().message;
    const ImageGrid& g = out->grid;
    const json& want = c["grid"];
    EXPECT_EQ(g.best_width, want["best_width"]);
    EXPECT_EQ(g.best_height, want["best_height"]);
    EXPECT_EQ(g.n_vit_h, want["n_vit_h"]);
    EXPECT_EQ(g.n_vit_w, want["n_vit_w"]);
    EXPECT_EQ(g.n_llm_h, want["n_llm_h"]);
    EXPECT_EQ(g.n_llm_w, want["n_llm_w"]);
    EXPECT_EQ(g.n_tokens, want["n_tokens"]);
    ASSERT_EQ(out->canvas.width, g.best_width);
    ASSERT_EQ(out->canvas.height, g.best_height);

    int max_diff = 0;
    for (const json& s : c["canvas_samples"]) {
      const uint8_t* px = out->canvas.row(s[0]) + 3 * s[1].get<int>();
      for (int ch = 0; ch < 3; ++ch) max_diff = std::max(max_diff, std::abs(int(px[ch]) - s[2 + ch].get<int>()));
    }
    EXPECT_EQ(max_diff, 0) << "sampled canvas pixels differ from Pillow";
    for (int ch = 0; ch < 3; ++ch) {
      int64_t sum = 0;
      for (size_t i = ch; i < out->canvas.rgb.size(); i += 3) sum += out->canvas.rgb[i];
      EXPECT_EQ(sum, c["canvas_channel_sums"][ch].get<int64_t>()) << "channel " << ch;
    }
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", (unsigned long long)test::fnv1a64(out->canvas.rgb));
    EXPECT_EQ(std::string(hash), c["canvas_fnv1a64"].get<std::string>());

    const size_t p = size_t(cfg.patch_size);
    ASSERT_EQ(out->patches.size(), size_t(g.n_vit_h) * g.n_vit_w * 3 * p * p);
    for (const json& s : c["patch_samples"]) {
      EXPECT_EQ(out->patches[s[0].get<size_t>()], s[1].get<uint16_t>()) << "patch element " << s[0];
    }
  }
}

}  // namespace
}  // namespace spw::vision
