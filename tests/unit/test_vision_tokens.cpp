// The image token layout and placeholder expansion (src/vision/image_tokens.h), vision_config
// parsing (vision_config.h), and data: URLs / base64 (image_url.h). The success path of a chat
// image: a decoded image under the released vision_config expands its prompt placeholder into
// [IMAGE_START] + ([IMAGE] x n_w + [IMAGE_NEW_LINE]) x n_h + [IMAGE_END], all carrying image_token_id.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "vision/image_tokens.h"
#include "vision/image_url.h"
#include "vision/vision_config.h"
#include "vision_synth.h"

namespace spw::vision {
namespace {

using nlohmann::json;
using TT = TokenType;

TEST(VisionTokens, LayoutOfOneImage) {
  const std::vector<TT> t = image_token_types(2, 3);
  const std::vector<TT> want = {TT::image_start, TT::image, TT::image, TT::image, TT::image_new_line,
                                TT::image, TT::image, TT::image, TT::image_new_line, TT::image_end};
  EXPECT_EQ(t, want);
  EXPECT_EQ(int64_t(t.size()), num_image_tokens(2, 3));
  EXPECT_EQ(num_image_tokens(13, 13), 184);
  EXPECT_EQ(num_image_tokens(1, 1021), 1024);
}

TEST(VisionTokens, ChatImageExpandsToItsTokenSpan) {
  // A 640x480 image under the released config: 644x490 canvas, 46x35 patches, 12x16 tokens.
  const VisionConfig cfg;  // the released DeepSeek-V4.1-Flash values
  auto plan = plan_image_grid(640, 480, cfg);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->n_llm_h, 12);
  EXPECT_EQ(plan->n_llm_w, 16);
  EXPECT_EQ(plan->n_tokens, 12 * 17 + 2);

  auto processed = process_image(test::synth_image(16, 12, 99), cfg);  // the rgb.png fixture's size
  ASSERT_TRUE(processed.ok());
  const ImageGrid g1 = processed->grid;
  const ImageGrid g2 = plan.value();
  const int32_t img = int32_t(cfg.image_token_id);
  const std::vector<int32_t> ids = {0, 128803, 11, img, 12, img, 128804};
  auto e = expand_image_placeholders(ids, img, std::vector<ImageGrid>{g1, g2});
  ASSERT_TRUE(e.ok()) << e.error().message;
  ASSERT_EQ(e->images.size(), 2u);
  EXPECT_EQ(e->ids.size(), ids.size() - 2 + size_t(g1.n_tokens + g2.n_tokens));
  EXPECT_EQ(e->types.size(), e->ids.size());
  EXPECT_EQ(e->images[0].start, 3u);
  EXPECT_EQ(e->images[1].start, 3u + size_t(g1.n_tokens) + 1);
  for (const ImageSpan& span : e->images) {
    const auto n = size_t(span.grid.n_tokens);
    const std::vector<TT> want = image_token_types(span.grid.n_llm_h, span.grid.n_llm_w);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), e->types.begin() + long(span.start)));
    EXPECT_TRUE(std::all_of(e->ids.begin() + long(span.start), e->ids.begin() + long(span.start + n),
                            [&](int32_t id) { return id == img; }));
  }
  EXPECT_EQ(e->ids[e->images[0].start - 1], 11);
  EXPECT_EQ(e->types[e->images[0].start - 1], TT::text);
  EXPECT_EQ(e->ids.back(), 128804);
  EXPECT_EQ(std::count(e->types.begin(), e->types.end(), TT::image), g1.n_llm_h * g1.n_llm_w + g2.n_llm_h * g2.n_llm_w);
  EXPECT_EQ(std::count(e->types.begin(), e->types.end(), TT::image_new_line), g1.n_llm_h + g2.n_llm_h);
}

TEST(VisionTokens, PlaceholderAndImageCountsMustAgree) {
  const std::vector<int32_t> ids = {1, 7, 2, 7};
  auto e = expand_image_placeholders(ids, 7, std::vector<ImageGrid>(1));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("2 image placeholders but 1 images"), std::string::npos) << e.error().message;
}

TEST(VisionConfigParse, NestedFlatAndAbsent) {
  auto nested = parse_vision_config(json::parse(R"({"image_token_id": 129264, "vision_config": {
      "model_type": "deepseek_v41_vision", "num_hidden_layers": 32, "hidden_size": 1024, "num_attention_heads": 16,
      "intermediate_size": 2816, "patch_size": 14, "rope_theta": 10000, "downsample_ratio": 3,
      "max_image_tokens": 1024, "min_pixels": 295936, "max_wh_ratio": null}})"), "config.json");
  ASSERT_TRUE(nested.ok()) << nested.error().message;
  ASSERT_TRUE(nested->has_value());
  EXPECT_EQ((*nested)->max_image_tokens, 1024);
  EXPECT_EQ((*nested)->min_pixels, 295936);
  EXPECT_FALSE((*nested)->max_wh_ratio);
  EXPECT_EQ((*nested)->image_token_id, 129264);

  auto flat = parse_vision_config(json::parse(R"({"vision_n_layers": 2, "vision_patch_size": 7,
      "vision_max_n_token": 64, "vision_min_pixels": 0, "vision_max_wh_ratio": 2.5, "image_token_id": 99})"), "c");
  ASSERT_TRUE(flat.ok() && flat->has_value());
  EXPECT_EQ((*flat)->patch_size, 7);
  EXPECT_EQ((*flat)->max_wh_ratio, 2.5);
  EXPECT_EQ((*flat)->image_token_id, 99);

  auto none = parse_vision_config(json::parse(R"({"model_type": "deepseek_v41"})"), "c");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto zero = parse_vision_config(json::parse(R"({"vision_n_layers": 0})"), "c");
  ASSERT_TRUE(zero.ok());
  EXPECT_FALSE(zero->has_value());

  auto demo = read_vision_config(std::string(SPW_SOURCE_DIR) + "/models/demo");
  ASSERT_TRUE(demo.ok()) << demo.error().message;
  EXPECT_FALSE(demo->has_value()) << "the demo model has no vision tower";
}

TEST(VisionConfigParse, BadValuesNameTheField) {
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"vision_config": {"num_hidden_layers": 2, "patch_size": 0}})", "vision_config.patch_size"},
           {R"({"vision_config": {"num_hidden_layers": 2, "max_image_tokens": "many"}})", "expected an integer"},
           {R"({"vision_config": {"num_hidden_layers": 2, "max_image_tokens": 3}})", "max_image_tokens: 3 is outside"},
           {R"({"vision_config": 5})", "vision_config: expected an object"},
           {R"({"vision_n_layers": 2, "vision_min_pixels": -1})", "vision_min_pixels"},
       }) {
    auto r = parse_vision_config(json::parse(text), "config.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
  }
}

TEST(VisionImageUrl, Base64IsStrict) {
  auto ok = base64_decode("aGVs\nbG8=", 100);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(std::string(ok->begin(), ok->end()), "hello");
  auto unpadded = base64_decode("aGVsbG8", 100);
  ASSERT_TRUE(unpadded.ok());
  EXPECT_EQ(unpadded->size(), 5u);
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"aGV*bG8=", "offset 3"}, {"aGVsbG8=aa", "after '=' padding"}, {"aGVsb", "whole number"},
           {"aGVsbG8-", "standard alphabet"}}) {
    auto r = base64_decode(text, 100);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
  }
  auto big = base64_decode("aGVsbG8=", 4);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("over the limit of 4 bytes"), std::string::npos);
}

TEST(VisionImageUrl, DataUrlChecks) {
  const std::vector<uint8_t> png = test::read_bytes(test::kVisionData + "decode/rgb.png");
  std::string b64;
  {
    static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < png.size(); i += 3) {
      const uint32_t v = uint32_t(png[i]) << 16 | (i + 1 < png.size() ? uint32_t(png[i + 1]) << 8 : 0) |
                         (i + 2 < png.size() ? png[i + 2] : 0);
      b64 += k[v >> 18 & 63];
      b64 += k[v >> 12 & 63];
      b64 += i + 1 < png.size() ? k[v >> 6 & 63] : '=';
      b64 += i + 2 < png.size() ? k[v & 63] : '=';
    }
  }
  for (const std::string& url : {"data:image/png;base64," + b64, "DATA:image/PNG;BASE64," + b64,
                                 "data:;base64," + b64, " data:image/png;charset=x;base64," + b64}) {
    auto r = load_image_url(url, {});
    ASSERT_TRUE(r.ok()) << url.substr(0, 40) << ": " << r.error().message;
    EXPECT_EQ(r->width, 16);
  }
  for (const auto& [url, says] : std::vector<std::pair<std::string, std::string>>{
           {"https://example.com/a.png", "fetches nothing"},
           {"HTTP://example.com/a.png", "fetches nothing"},
           {"file:///etc/passwd", "unsupported image URL"},
           {"", "unsupported image URL (empty)"},
           {"data:image/png;base64", "no ','"},
           {"data:image/png," + b64, "not base64-encoded"},
           {"data:image/jpeg;base64," + b64, "says image/jpeg but the bytes are a PNG image"},
           {"data:image/tiff;base64," + b64, "unsupported image MIME type \"image/tiff\""},
           {"data:image/png;base64,", "carries no data"},
       }) {
    auto r = load_image_url(url, {});
    ASSERT_FALSE(r.ok()) << url.substr(0, 40);
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace spw::vision
