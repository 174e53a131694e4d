// The one weight map (model/weights.cpp): every linear the loader fills records where the checkpoint stores
// it (Linear::stem), and that is a stored tensor of the linear's shape, so the GPU uploader
// (engine/device_weights.cpp), which reads the stored bytes back through the stem, names no tensor itself.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/exl3.h"
#include "model/model.h"
#include "model/weights.h"

namespace spw {
namespace {

// Checks one linear; returns 1 when it is present (n_out > 0), else 0.
int check(const Checkpoint& ck, const Linear& l, const std::string& what) {
  if (l.n_out == 0) return 0;
  EXPECT_FALSE(l.stem.empty()) << what << ": no stem";
  auto find = [&](const std::string& n) {
    const TensorInfo* t = ck.find(n);
    return t ? t : ck.find("model." + n);
  };
  if (exl3_is_stored(find, l.stem)) return 1;
  const TensorInfo* t = find(l.stem + ".weight");
  EXPECT_NE(t, nullptr) << what << ": " << l.stem << ".weight is not in the checkpoint";
  if (!t) return 1;
  EXPECT_EQ(t->shape.size(), 2u) << what;
  if (t->shape.size() != 2) return 1;
  EXPECT_EQ(t->shape[0], l.n_out) << what << ": " << l.stem;
  // MXFP4 packs two values a byte.
  EXPECT_EQ(t->shape[1], l.kind == LinearKind::Fp4 ? l.n_in / 2 : l.n_in) << what << ": " << l.stem;
  return 1;
}

void every_linear_names_its_stored_tensor(const std::string& dir) {
  auto config = read_model_config(dir);
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto w = load_weights(dir, *config);
  ASSERT_TRUE(w.ok()) << w.error().message;
  const Checkpoint& ck = (*w)->checkpoint;
  int n = check(ck, (*w)->head, "head");
  for (size_t i = 0; i < (*w)->layers.size(); ++i) {
    const LayerWeights& lw = (*w)->layers[i];
    const std::string L = "layer " + std::to_string(i) + " ";
    for (const auto& [l, name] : std::vector<std::pair<const Linear*, const char*>>{
             {&lw.wq_a, "wq_a"},
             {&lw.wq_b, "wq_b"},
             {&lw.wkv, "wkv"},
             {&lw.wo_a, "wo_a"},
             {&lw.wo_b, "wo_b"},
             {&lw.comp_wkv, "comp_wkv"},
             {&lw.comp_wgate, "comp_wgate"},
             {&lw.idx_wq_b, "idx_wq_b"},
             {&lw.idx_weights_proj, "idx_weights_proj"},
             {&lw.idx_comp_wkv, "idx_comp_wkv"},
             {&lw.idx_comp_wgate, "idx_comp_wgate"},
             {&lw.idx_wk, "idx_wk"},
             {&lw.gate, "gate"},
             {&lw.shared.w1, "shared.w1"},
             {&lw.shared.w2, "shared.w2"},
             {&lw.shared.w3, "shared.w3"},
             {&lw.engram.wkv, "engram.wkv"}})
      n += check(ck, *l, L + name);
    for (size_t e = 0; e < lw.experts.size(); ++e)
      for (const Linear* l : {&lw.experts[e].w1, &lw.experts[e].w2, &lw.experts[e].w3})
        n += check(ck, *l, L + "expert " + std::to_string(e));
  }
  std::printf("[ measured ] %s: %d linears, each named by its stem\n", dir.c_str(), n);
  EXPECT_GT(n, 10);
}

TEST(WeightMap, V41FixtureLinearsNameTheirTensors) {
  every_linear_names_its_stored_tensor(std::string(SPW_SOURCE_DIR) + "/tests/golden/fixtures/v41/model");
}

TEST(WeightMap, V4FixtureLinearsNameTheirTensors) {
  every_linear_names_its_stored_tensor(std::string(SPW_SOURCE_DIR) + "/tests/golden/fixtures/v4/model");
}

TEST(WeightMap, DemoModelLinearsNameTheirTensors) {
  every_linear_names_its_stored_tensor(std::string(SPW_SOURCE_DIR) + "/models/demo");
}

}  // namespace
}  // namespace spw
