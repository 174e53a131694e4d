// The synthetic V4.1-Flash built in memory (model/synthetic_model.h): it loads through the same loader as a
// checkpoint on disk, runs a finite CPU forward, its routing skew makes hot experts, each expert has its own bytes,
// and bad specs are refused. That its tensor inventory equals tools/synth/make_synthetic_model.py's is checked in
// tests/python/test_synth_model.py (the two memory plans and per-token costs print the same).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/model.h"
#include "model/synthetic_model.h"
#include "model/weights.h"

namespace spw {
namespace {

SyntheticSpec small_spec() {
  SyntheticSpec s;
  s.layers = 3;  // a window layer, an Engram layer, a KV and index source
  s.width_divisor = 8;
  s.expert_bits = 2;
  s.engram_vocab = 2000;
  return s;
}

std::unique_ptr<Model> load(SyntheticModel m) {
  auto w = load_weights(std::move(m.checkpoint), m.config);
  EXPECT_TRUE(w.ok()) << w.error().message;
  if (!w.ok()) return nullptr;
  return std::make_unique<Model>(m.config, std::move(w.value()), Numerics::reference());
}

// The share of all routes that went to each layer's most picked quarter of experts.
double top_quarter_share(const RoutingCounts& rc) {
  int64_t top = 0, all = 0;
  for (std::vector<int64_t> c : rc.counts) {
    std::sort(c.rbegin(), c.rend());
    top += std::accumulate(c.begin(), c.begin() + long(c.size() / 4), int64_t(0));
    all += std::accumulate(c.begin(), c.end(), int64_t(0));
  }
  return all ? double(top) / double(all) : 0;
}

std::vector<int32_t> prompt(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 7919 + 13) % 129280);
  return t;
}

TEST(SyntheticModel, LoadsAndRunsAFiniteForward) {
  auto m = make_synthetic_model(small_spec());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->config.n_layers, 3);
  EXPECT_EQ(m->config.d_model, 640);
  EXPECT_EQ(m->config.exl3_expert_bits, 2);
  ASSERT_TRUE(m->config.is_v41());
  EXPECT_TRUE(m->config.layers[1].engram);
  EXPECT_TRUE(m->config.layers[2].kv_source);
  auto model = load(std::move(m.value()));
  ASSERT_TRUE(model);
  SequenceState seq = model->new_sequence();
  const std::vector<int32_t> toks = prompt(40);
  ForwardOptions opt;
  opt.all_logits = true;
  int layers_seen = 0;
  opt.on_layer = [&](int, const std::vector<float>& streams) {
    ++layers_seen;
    for (float v : streams) ASSERT_TRUE(std::isfinite(v));
  };
  auto logits = model->forward(seq, toks, opt);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  EXPECT_EQ(layers_seen, 3);
  ASSERT_EQ(logits->size(), toks.size() * size_t(model->config().vocab_size));
  double sum = 0, sum2 = 0;
  for (float v : *logits) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v, sum2 += double(v) * v;
  }
  const double n = double(logits->size());
  EXPECT_GT(std::sqrt(sum2 / n - (sum / n) * (sum / n)), 1e-3);  // not a constant: the weights reach the logits
  auto next = model->forward(seq, std::vector<int32_t>{5});   // and a decode step after the prompt
  ASSERT_TRUE(next.ok()) << next.error().message;
}

TEST(SyntheticModel, EveryExpertHasItsOwnBytesAndTheSeedDecidesThem) {
  auto a = make_synthetic_model(small_spec());
  auto b = make_synthetic_model(small_spec());
  SyntheticSpec other = small_spec();
  other.seed = 7;
  auto c = make_synthetic_model(other);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const TensorInfo* e0 = a->checkpoint.find("layers.0.ffn.experts.0.w1.trellis");
  const TensorInfo* e1 = a->checkpoint.find("layers.0.ffn.experts.1.w1.trellis");
  const TensorInfo* e0b = b->checkpoint.find("layers.0.ffn.experts.0.w1.trellis");
  const TensorInfo* e0c = c->checkpoint.find("layers.0.ffn.experts.0.w1.trellis");
  ASSERT_TRUE(e0 && e1 && e0b && e0c);
  EXPECT_EQ(e0->shape, (std::vector<int64_t>{640 / 16, 384 / 16, 32}));
  EXPECT_NE(std::memcmp(e0->data, e1->data, e0->nbytes), 0);
  EXPECT_EQ(std::memcmp(e0->data, e0b->data, e0->nbytes), 0);
  EXPECT_NE(std::memcmp(e0->data, e0c->data, e0->nbytes), 0);
  const TensorInfo* embed = a->checkpoint.find("embed.weight");
  ASSERT_TRUE(embed);
  EXPECT_EQ(std::memcmp(embed->data, b->checkpoint.find("embed.weight")->data, embed->nbytes), 0);
}

TEST(SyntheticModel, RoutingSkewMakesHotExperts) {
  // Measured on this model: the most picked quarter of experts takes 0.43 of the routes without skew (96 tokens
  // give each of 48 experts only ~12 picks per layer, so even uniform routing has a heavy top quarter) and 0.61 at
  // 0.15. The bounds: the skew must add at least 0.1, and unskewed routing must stay well below the skewed figure.
  auto share = [](double skew) {
    SyntheticSpec s = small_spec();
    s.routing_skew = skew;
    auto m = make_synthetic_model(s);
    EXPECT_TRUE(m.ok());
    auto model = load(std::move(m.value()));
    RoutingCounts rc;
    rc.reset(model->config().n_layers, model->config().n_experts);
    ForwardOptions opt;
    opt.routing_counts = &rc;
    SequenceState seq = model->new_sequence();
    EXPECT_TRUE(model->forward(seq, prompt(96), opt).ok());
    return top_quarter_share(rc);
  };
  const double uniform = share(0), skewed = share(0.15);
  EXPECT_LT(uniform, 0.5) << "skewed " << skewed;
  EXPECT_GT(skewed, uniform + 0.1) << "uniform " << uniform;
}

TEST(SyntheticModel, RefusesWhatItCannotBuild) {
  auto expect_error = [](SyntheticSpec s, const std::string& needle) {
    auto m = make_synthetic_model(s);
    ASSERT_FALSE(m.ok()) << needle;
    EXPECT_NE(m.error().message.find(needle), std::string::npos) << m.error().message;
  };
  SyntheticSpec s = small_spec();
  s.name = "v4-flash";
  expect_error(s, "make_synthetic_model.py --arch v4");
  s = small_spec();
  s.layers = 41;
  expect_error(s, "--layers");
  s = small_spec();
  s.expert_bits = 9;
  expect_error(s, "--expert-bits");
  s = small_spec();
  s.routing_skew = -1;
  expect_error(s, "--routing-skew");
  s = small_spec();
  s.width_divisor = 7;  // widths that are not powers of two: d_model 5120 / 7 → 768, expert width 2304 / 7 → 384
  EXPECT_TRUE(make_synthetic_model(s).ok());
}

}  // namespace
}  // namespace spw
