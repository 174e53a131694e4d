// The GPU vision tower (vision/vision_tower_cuda.h) against the numpy oracle's goldens of the tiny tower
// (tools/vision/make_tiny_vision.py, as tests/unit/test_vision_tower.cpp holds the CPU reference to them)
// and against the CPU reference on a wider random tower and a larger image (heads of 64 as released, 1,680
// patches). Tolerances: f32 on both sides, only the summation order differs (cuBLAS blocking, the norm's
// f64 tree); 1e-4 of the output's largest |value| leaves a wide margin over the ~1e-6 relative such orders
// give, while a wrong RoPE slot, cell order or missing bias moves outputs by 1e-2 or more.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "formats/safetensors.h"
#include "gpu_test_util.h"
#include "vision/vision_tower.h"
#include "vision/vision_tower_cuda.h"

namespace spw::vision {
namespace {

const std::string kDataDir = std::string(SPW_SOURCE_DIR) + "/tests/unit/data/vision";

float max_rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  float m = 0, scale = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    m = std::max(m, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return m / std::max(scale, 1e-30f);
}

TEST(VisionTowerCuda, TinyTowerMatchesOracle) {
  SPW_REQUIRE_GPU();
  const std::string dir = kDataDir + "/tiny_tower";
  auto config = read_vision_config(dir);
  ASSERT_TRUE(config.ok() && config->has_value());
  std::ifstream f(dir + "/config.json");
  const int d_llm = nlohmann::json::parse(f).at("text_config").at("hidden_size").get<int>();
  auto w = load_vision_weights(dir, **config, d_llm);
  ASSERT_TRUE(w.ok() && w->has_value());
  auto tower = VisionTowerCuda::create(**w);
  ASSERT_TRUE(tower.ok()) << tower.error().message;
  auto file = SafetensorsFile::open(kDataDir + "/tower_goldens.safetensors");
  ASSERT_TRUE(file.ok());
  const int r = (**config).downsample_ratio;
  for (int k = 0; k < 3; ++k) {
    const std::string s = std::to_string(k);
    const TensorInfo* grid = (*file)->find("grid_" + s);
    const TensorInfo* patches = (*file)->find("patches_" + s);
    ASSERT_TRUE(grid && patches);
    int32_t hw[2];
    std::memcpy(hw, grid->data, 8);
    ProcessedImage image;
    image.grid.n_vit_h = hw[0];
    image.grid.n_vit_w = hw[1];
    image.grid.n_llm_h = (hw[0] + r - 1) / r;
    image.grid.n_llm_w = (hw[1] + r - 1) / r;
    image.grid.n_tokens = num_image_tokens(image.grid.n_llm_h, image.grid.n_llm_w);
    image.patches.resize(size_t(patches->numel()));
    std::memcpy(image.patches.data(), patches->data, patches->nbytes);
    auto got = (*tower)->encode(image);
    ASSERT_TRUE(got.ok()) << got.error().message;
    const float diff = max_rel_diff(*got, tensor_floats(*(*file)->find("aligner_" + s)));
    std::printf("  [vision cuda] tiny %dx%d: max |diff| / max |x| %.2e\n", hw[0], hw[1], diff);
    EXPECT_LE(diff, 1e-4f) << "grid " << hw[0] << "x" << hw[1];
    auto span = (*tower)->span_embeddings(image);
    ASSERT_TRUE(span.ok());
    EXPECT_EQ(span->size(), size_t(image.grid.n_tokens) * size_t(d_llm));
  }
}

// Random weights of the given shape (each tensor ~ N(0, 1/fan_in), norms near 1).
VisionWeights random_tower(const VisionConfig& c, int d_llm, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](size_t n, float std) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng) * std;
    return v;
  };
  auto ones = [&](size_t n) {
    std::vector<float> v = fill(n, 0.1f);
    for (float& x : v) x += 1.f;
    return v;
  };
  const size_t d = size_t(c.d_model), di = size_t(c.d_inter), p = 3 * size_t(c.patch_size) * c.patch_size;
  const size_t rr = size_t(c.downsample_ratio) * c.downsample_ratio, D = size_t(d_llm);
  VisionWeights w;
  w.config = c;
  w.d_llm = d_llm;
  w.patch_embed = fill(d * p, 2.f / std::sqrt(float(p)));
  w.patch_embed_bias = fill(d, 0.1f);
  for (int b = 0; b < c.n_layers; ++b) {
    VitBlockWeights blk;
    blk.norm1 = ones(d);
    blk.norm2 = ones(d);
    blk.wqkv = fill(3 * d * d, 1.5f / std::sqrt(float(d)));
    blk.wqkv_bias = fill(3 * d, 0.1f);
    blk.wo = fill(d * d, 1.f / std::sqrt(float(d)));
    blk.wo_bias = fill(d, 0.1f);
    blk.w1 = fill(2 * di * d, 1.f / std::sqrt(float(d)));
    blk.w2 = fill(d * di, 1.f / std::sqrt(float(di)));
    w.blocks.push_back(std::move(blk));
  }
  w.norm = ones(d);
  w.aligner_w1 = fill(D * rr * d, 1.f / std::sqrt(float(rr * d)));
  w.aligner_w1_bias = fill(D, 0.1f);
  w.aligner_w2 = fill(D * D, 1.f / std::sqrt(float(D)));
  w.aligner_w2_bias = fill(D, 0.1f);
  w.image_start = fill(D, 1.f);
  w.image_end = fill(D, 1.f);
  w.image_newline = fill(D, 1.f);
  return w;
}

TEST(VisionTowerCuda, WiderTowerMatchesCpuReference) {
  SPW_REQUIRE_GPU();
  VisionConfig c;
  c.n_layers = 2;
  c.d_model = 128;
  c.n_heads = 2;  // heads of 64, as released
  c.d_inter = 256;
  const VisionWeights w = random_tower(c, 96, 7);
  auto tower = VisionTowerCuda::create(w);
  ASSERT_TRUE(tower.ok()) << tower.error().message;
  ProcessedImage image;
  image.grid = {0, 0, 40, 42, 14, 14, num_image_tokens(14, 14)};
  std::mt19937 rng(3);
  image.patches.resize(size_t(40 * 42) * 3 * 14 * 14);
  for (uint16_t& b : image.patches) b = f32_to_bf16(float(int(rng() % 256)) / 127.5f - 1.f);
  auto want = image_span_embeddings_ref(w, image);
  auto got = (*tower)->span_embeddings(image);
  ASSERT_TRUE(want.ok() && got.ok()) << (got.ok() ? "" : got.error().message);
  const float diff = max_rel_diff(*got, *want);
  std::printf("  [vision cuda] 40x42 patches, heads of 64: max |diff| / max |x| %.2e\n", diff);
  EXPECT_LE(diff, 1e-4f);
  // The same patches read as the transposed grid change every RoPE angle: the comparison can fail.
  ProcessedImage transposed = image;
  transposed.grid = {0, 0, 42, 40, 14, 14, num_image_tokens(14, 14)};
  auto other = (*tower)->span_embeddings(transposed);
  ASSERT_TRUE(other.ok());
  EXPECT_GT(max_rel_diff(*other, *want), 100 * 1e-4f);
}

}  // namespace
}  // namespace spw::vision
#endif  // SPW_HAVE_CUDA
