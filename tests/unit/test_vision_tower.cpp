// The f32 CPU reference of the V4.1 ViT + aligner (src/vision/vision_tower.*) against the float64
// numpy oracle of tools/vision/make_tiny_vision.py on a tiny random tower (hidden 64, 2 layers,
// 4 heads of 16, LLM width 32), three patch grids (4x5 and 7x2 pad in the aligner, 3x3 does not);
// plus the weight loader's shape checks and the forward's input checks.
//
// Tolerance: 2e-5 absolute on outputs of magnitude up to ~3.5. Both sides start from the same
// BF16-rounded weights and patches; they differ only in f32 vs f64 arithmetic and summation order
// (sums of up to 588 terms, two blocks, exp/erf in f32), which measures up to ~3.5e-6 here; the
// bound leaves ~6x headroom for other compilers and libms. The subtlest plausible mistake, the tanh
// GELU instead of erf, moves the aligner's outputs by ~3e-4; a swapped RoPE row/column order, a
// spatial-major unfold or a dropped bias move them far more. TransposedGridIsCaught keeps one such
// check in the suite.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/dtypes.h"
#include "formats/safetensors.h"
#include "vision/image_tokens.h"
#include "vision/vision_tower.h"
#include "vision/vision_weights.h"
#include "vision_synth.h"

namespace spw::vision {
namespace {

namespace fs = std::filesystem;

constexpr float kTolerance = 2e-5f;
constexpr int kImages = 3;

const std::string kDataDir = std::string(SPW_SOURCE_DIR) + "/tests/unit/data/vision";
const std::string kModelDir = kDataDir + "/tiny_tower";

int tiny_d_llm() {
  std::ifstream f(kModelDir + "/config.json");
  return nlohmann::json::parse(f).at("text_config").at("hidden_size").get<int>();
}

VisionConfig tiny_config() {
  auto c = read_vision_config(kModelDir);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  EXPECT_TRUE(c.ok() && c->has_value());
  return c.ok() && c->has_value() ? **c : VisionConfig{};
}

struct Golden {
  int n_h = 0, n_w = 0;
  std::vector<uint16_t> patch_bits;
  std::vector<float> patches, vit, aligner;
};

class VisionTower : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto w = load_vision_weights(kModelDir, tiny_config(), tiny_d_llm());
    ASSERT_TRUE(w.ok()) << w.error().message;
    ASSERT_TRUE(w->has_value());
    weights_ = new VisionWeights(std::move(**w));
    auto file = SafetensorsFile::open(kDataDir + "/tower_goldens.safetensors");
    ASSERT_TRUE(file.ok()) << file.error().message;
    goldens_ = new std::vector<Golden>(kImages);
    for (int k = 0; k < kImages; ++k) {
      const std::string s = std::to_string(k);
      const TensorInfo* grid = (*file)->find("grid_" + s);
      const TensorInfo* patches = (*file)->find("patches_" + s);
      ASSERT_TRUE(grid && patches && (*file)->find("vit_" + s) && (*file)->find("aligner_" + s));
      Golden& g = (*goldens_)[size_t(k)];
      int32_t hw[2];
      std::memcpy(hw, grid->data, 8);
      g.n_h = hw[0];
      g.n_w = hw[1];
      g.patch_bits.resize(size_t(patches->numel()));
      std::memcpy(g.patch_bits.data(), patches->data, patches->nbytes);
      g.patches = tensor_floats(*patches);
      g.vit = tensor_floats(*(*file)->find("vit_" + s));
      g.aligner = tensor_floats(*(*file)->find("aligner_" + s));
    }
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete goldens_;
  }
  static const VisionWeights* weights_;
  static std::vector<Golden>* goldens_;
};
const VisionWeights* VisionTower::weights_ = nullptr;
std::vector<Golden>* VisionTower::goldens_ = nullptr;

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

TEST_F(VisionTower, VitMatchesOracle) {
  for (const Golden& g : *goldens_) {
    auto vit = vit_forward_ref(*weights_, g.patches, g.n_h, g.n_w);
    ASSERT_TRUE(vit.ok()) << vit.error().message;
    ASSERT_EQ(vit->size(), size_t(g.n_h) * g.n_w * weights_->config.d_model);
    const float diff = max_abs_diff(*vit, g.vit);
    std::printf("  vit %dx%d: max |diff| %.3g\n", g.n_h, g.n_w, double(diff));
    EXPECT_LE(diff, kTolerance) << "grid " << g.n_h << "x" << g.n_w;
  }
}

TEST_F(VisionTower, AlignerMatchesOracle) {
  for (const Golden& g : *goldens_) {
    // Fed the oracle's ViT output, so only the aligner's error is measured.
    auto out = aligner_forward_ref(*weights_, g.vit, g.n_h, g.n_w);
    ASSERT_TRUE(out.ok()) << out.error().message;
    const int r = weights_->config.downsample_ratio;
    ASSERT_EQ(out->size(), size_t((g.n_h + r - 1) / r) * ((g.n_w + r - 1) / r) * weights_->d_llm);
    const float diff = max_abs_diff(*out, g.aligner);
    std::printf("  aligner %dx%d: max |diff| %.3g\n", g.n_h, g.n_w, double(diff));
    EXPECT_LE(diff, kTolerance) << "grid " << g.n_h << "x" << g.n_w;
  }
}

TEST_F(VisionTower, EncodeProcessedImageMatchesOracle) {
  const int r = weights_->config.downsample_ratio;
  for (const Golden& g : *goldens_) {
    ProcessedImage image;
    image.grid.n_vit_h = g.n_h;
    image.grid.n_vit_w = g.n_w;
    image.grid.n_llm_h = (g.n_h + r - 1) / r;
    image.grid.n_llm_w = (g.n_w + r - 1) / r;
    image.patches = g.patch_bits;
    auto out = vision_encode_ref(*weights_, image);
    ASSERT_TRUE(out.ok()) << out.error().message;
    const float diff = max_abs_diff(*out, g.aligner);
    std::printf("  vit + aligner %dx%d: max |diff| %.3g\n", g.n_h, g.n_w, double(diff));
    EXPECT_LE(diff, kTolerance) << "grid " << g.n_h << "x" << g.n_w;
  }
}

// The comparison can fail: the same patches read as a transposed grid change every RoPE angle.
TEST_F(VisionTower, TransposedGridIsCaught) {
  const Golden& g = (*goldens_)[0];
  auto vit = vit_forward_ref(*weights_, g.patches, g.n_w, g.n_h);
  ASSERT_TRUE(vit.ok()) << vit.error().message;
  EXPECT_GT(max_abs_diff(*vit, g.vit), 100 * kTolerance);
}

TEST_F(VisionTower, ForwardRejectsMismatchedInputs) {
  const Golden& g = (*goldens_)[0];
  auto vit = vit_forward_ref(*weights_, g.patches, g.n_h + 1, g.n_w);
  ASSERT_FALSE(vit.ok());
  EXPECT_NE(vit.error().message.find("patch values"), std::string::npos) << vit.error().message;
  EXPECT_FALSE(vit_forward_ref(*weights_, {}, 0, 0).ok());
  auto al = aligner_forward_ref(*weights_, g.vit, g.n_h, g.n_w + 1);
  ASSERT_FALSE(al.ok());
  EXPECT_NE(al.error().message.find("expected"), std::string::npos) << al.error().message;
  ProcessedImage image;
  image.grid = {0, 0, g.n_h, g.n_w, 5, 5, 0};
  image.patches = g.patch_bits;
  auto enc = vision_encode_ref(*weights_, image);
  ASSERT_FALSE(enc.ok());
  EXPECT_NE(enc.error().message.find("LLM grid"), std::string::npos) << enc.error().message;
}

// From decoded pixels through the processor: one embedding per IMAGE position of the span.
TEST_F(VisionTower, ProcessedImageGivesOneEmbeddingPerImagePosition) {
  auto image = process_image(test::synth_image(100, 45, 7), weights_->config);
  ASSERT_TRUE(image.ok()) << image.error().message;
  const ImageGrid& g = image->grid;
  auto out = vision_encode_ref(*weights_, *image);
  ASSERT_TRUE(out.ok()) << out.error().message;
  ASSERT_EQ(out->size(), size_t(g.n_llm_h) * g.n_llm_w * weights_->d_llm);
  EXPECT_EQ(g.n_tokens, int64_t(g.n_llm_h) * (g.n_llm_w + 1) + 2);
  EXPECT_TRUE(std::all_of(out->begin(), out->end(), [](float v) { return std::isfinite(v); }));
}

// The whole span: image_start, each LLM row's cells then image_newline, image_end (image_tokens.h's layout).
TEST_F(VisionTower, SpanEmbeddingsFollowTheTokenLayout) {
  auto image = process_image(test::synth_image(100, 45, 7), weights_->config);
  ASSERT_TRUE(image.ok()) << image.error().message;
  const ImageGrid& g = image->grid;
  auto cells = vision_encode_ref(*weights_, *image);
  auto span = image_span_embeddings_ref(*weights_, *image);
  ASSERT_TRUE(cells.ok() && span.ok());
  const size_t d = size_t(weights_->d_llm);
  ASSERT_EQ(span->size(), size_t(g.n_tokens) * d);
  const std::vector<TokenType> types = image_token_types(g.n_llm_h, g.n_llm_w);
  size_t cell = 0;
  for (size_t pos = 0; pos < types.size(); ++pos) {
    const float* got = span->data() + pos * d;
    const float* want = types[pos] == TokenType::image_start      ? weights_->image_start.data()
                        : types[pos] == TokenType::image_new_line ? weights_->image_newline.data()
                        : types[pos] == TokenType::image_end      ? weights_->image_end.data()
                                                                  : cells->data() + cell++ * d;
    ASSERT_TRUE(std::equal(got, got + d, want)) << "position " << pos;
  }
  EXPECT_EQ(cell, size_t(g.n_llm_h) * g.n_llm_w);
}

// Loads the tiny tower with a mutated config and expects an Error mentioning every `needles`.
void expect_load_error(const VisionConfig& config, int d_llm, const std::vector<std::string>& needles) {
  auto w = load_vision_weights(kModelDir, config, d_llm);
  ASSERT_FALSE(w.ok());
  for (const std::string& n : needles)
    EXPECT_NE(w.error().message.find(n), std::string::npos) << "missing '" << n << "' in: " << w.error().message;
}

TEST(VisionWeightsLoad, ShapeMismatchesNameTheTensor) {
  const VisionConfig base = tiny_config();
  const int d_llm = tiny_d_llm();
  VisionConfig c = base;
  c.d_inter += 1;
  expect_load_error(c, d_llm, {"vision.blocks.0.mlp.w1.weight", "[128, 64]", "[130, 64]"});
  c = base;
  c.patch_size = 16;
  expect_load_error(c, d_llm, {"vision.patch_embed.proj.weight", "[64, 768]"});
  c = base;
  c.downsample_ratio = 2;
  expect_load_error(c, d_llm, {"aligner.w1.weight", "[32, 256]"});
  expect_load_error(base, d_llm + 1, {"aligner.w1.weight", "[33, 576]"});
  c = base;
  c.n_layers = 3;
  expect_load_error(c, d_llm, {"missing vision tensor 'vision.blocks.2.norm1.weight'"});
  c = base;
  c.n_layers = 1;
  expect_load_error(c, d_llm, {"vision block 1", "num_hidden_layers = 1"});
}

TEST(VisionWeightsLoad, UnsupportedHeadShapes) {
  VisionConfig c = tiny_config();
  c.n_heads = 3;
  expect_load_error(c, tiny_d_llm(), {"not a multiple of num_attention_heads"});
  c.n_heads = 32;  // d_head 2
  expect_load_error(c, tiny_d_llm(), {"multiple of 4"});
  EXPECT_TRUE(check_vision_shapes(tiny_config()).ok());
}

TEST(VisionWeightsLoad, TextOnlyCheckpointHasNoTower) {
  const fs::path dir = fs::temp_directory_path() / ("spw_vision_text_only_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string header = R"({"embed.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += header + std::string(8, '\0');
  std::ofstream(dir / "model.safetensors", std::ios::binary) << bytes;
  auto w = load_vision_weights(dir.string(), tiny_config(), tiny_d_llm());
  fs::remove_all(dir);
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_FALSE(w->has_value());
}

}  // namespace
}  // namespace spw::vision
