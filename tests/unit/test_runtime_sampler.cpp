// Sampler: logit_bias is added before drawing (greedy and sampled), never un-masks a constrained
// token, and leaves the reported logprobs those of the model.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

}  // namespace
}  // namespace spw::runtime
