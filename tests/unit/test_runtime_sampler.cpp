// Sampler: logit_bias is added before drawing (greedy and sampled), never un-masks a constrained
// token, and leaves the reported logprobs those of the model; a runner's pick (TokenPick) is offered
// only where the host needs no logits, and draws the same uniforms as sampling on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "runtime/sampler.h"

namespace spw::runtime {
namespace {

// Allows only the tokens in `allowed`.
class OnlyTokens final : public LogitsConstraint {
 public:
  explicit OnlyTokens(std::vector<int32_t> allowed) : allowed_(std::move(allowed)) {}
  void mask(std::span<float> logits) override {
    for (size_t i = 0; i < logits.size(); ++i)
      if (std::find(allowed_.begin(), allowed_.end(), int32_t(i)) == allowed_.end())
        logits[i] = -std::numeric_limits<float>::infinity();
  }
  void accept(int32_t) override {}

 private:
  std::vector<int32_t> allowed_;
};

const std::vector<float> kLogits = {0.f, 3.f, 1.f, 2.f, -1.f};

TEST(Sampler, GreedyWithoutBiasTakesTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(Sampler(p).sample(kLogits).id, 1);
}

TEST(Sampler, PositiveBiasForcesAToken) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{4, 100.f}};
  EXPECT_EQ(Sampler(p).sample(kLogits).id, 4);
}

TEST(Sampler, NegativeBiasBansAToken) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{1, -100.f}};
  EXPECT_EQ(Sampler(p).sample(kLogits).id, 3);
}

TEST(Sampler, BiasAppliesWhenSampling) {
  SamplingParams p;
  p.temperature = 1;
  p.seed = 7;
  p.logit_bias = {{0, -100.f}, {1, -100.f}, {2, -100.f}, {3, -100.f}};
  Sampler s(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(kLogits).id, 4);
}

TEST(Sampler, BiasNeverUnmasksAConstrainedToken) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{4, 100.f}};
  Sampler s(p, std::make_shared<OnlyTokens>(std::vector<int32_t>{2, 3}));
  EXPECT_EQ(s.sample(kLogits).id, 3);
}

TEST(Sampler, LogprobsIgnoreTheBias) {
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 1;
  p.logit_bias = {{4, 100.f}};
  const GeneratedToken t = Sampler(p).sample(kLogits);
  double z = 0;
  for (float l : kLogits) z += std::exp(double(l));
  EXPECT_EQ(t.id, 4);
  EXPECT_NEAR(t.logprob, -1.0 - std::log(z), 1e-5);
  ASSERT_EQ(t.top.size(), 1u);
  EXPECT_EQ(t.top[0].id, 1);
}

TEST(Sampler, RunnerMayPickOnlyWithoutHostWork) {
  SamplingParams plain;
  plain.temperature = 0.7f;
  plain.top_p = 0.9f;
  EXPECT_TRUE(Sampler(plain).runner_may_pick());
  SamplingParams p = plain;
  p.top_logprobs = 0;
  EXPECT_FALSE(Sampler(p).runner_may_pick()) << "logprobs need the logits";
  p = plain;
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(Sampler(p).runner_may_pick()) << "penalties change the logits";
  p = plain;
  p.frequency_penalty = -0.5f;
  EXPECT_FALSE(Sampler(p).runner_may_pick());
  p = plain;
  p.logit_bias = {{2, 1.f}};
  EXPECT_FALSE(Sampler(p).runner_may_pick()) << "a bias changes the logits";
  EXPECT_FALSE(Sampler(plain, std::make_shared<OnlyTokens>(std::vector<int32_t>{2})).runner_may_pick())
      << "a constraint masks the logits";
}

// The same seed gives the same tokens whether each is sampled on the host, or picked through next_pick()
// and then drawn on the host with the pick's uniform (what happens when a runner returns logits).
TEST(Sampler, PicksDrawWhatSamplingDraws) {
  SamplingParams p;
  p.temperature = 1.3f;
  p.top_k = 4;
  p.min_p = 0.01f;
  p.top_p = 0.95f;
  p.seed = 1234;
  Sampler host(p), picked(p);
  std::vector<int32_t> a, b;
  for (int i = 0; i < 200; ++i) {
    a.push_back(host.sample(kLogits).id);
    const TokenPick pick = picked.next_pick();
    EXPECT_EQ(pick.temperature, p.temperature);
    EXPECT_EQ(pick.top_k, p.top_k);
    EXPECT_GE(pick.u, 0.0);
    EXPECT_LT(pick.u, 1.0);
    b.push_back(picked.sample(kLogits, pick).id);
  }
  EXPECT_EQ(a, b);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 1u) << "a real draw, not a constant";
  // Greedy: no uniform drawn, and a runner's token is taken as is.
  SamplingParams g;
  g.temperature = 0;
  Sampler greedy(g);
  EXPECT_EQ(greedy.next_pick().u, 0.0);
  EXPECT_EQ(greedy.accept(3).id, 3);
}

}  // namespace
}  // namespace spw::runtime
