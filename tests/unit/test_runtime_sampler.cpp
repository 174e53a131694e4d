// Sampler: logit_bias is added before drawing (greedy and sampled), never un-masks a constrained
// token, and leaves the reported logprobs those of the model; a runner's pick (TokenPick) carries the
// whole pipeline's inputs and draws the same uniforms as sampling on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "runtime/sampler.h"

namespace spw::runtime {
namespace {

// Allows only the tokens in `allowed`.
class OnlyTokens final : public LogitsConstraint {
 public:
  explicit OnlyTokens(std::vector<int32_t> allowed) : allowed_(std::move(allowed)) {}
  void allowed(std::span<uint64_t> bits) override {
    for (int32_t id : allowed_) bits[size_t(id) / 64] |= uint64_t(1) << (size_t(id) % 64);
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

TEST(Sampler, RunnerMayPickUpToTheTopLogprobsAPickReports) {
  SamplingParams p;
  p.top_logprobs = kMaxPickTopLogprobs;
  EXPECT_TRUE(Sampler(p).runner_may_pick());
  p.top_logprobs = kMaxPickTopLogprobs + 1;
  EXPECT_FALSE(Sampler(p).runner_may_pick());
}

// A pick carries what the host pipeline would apply: the penalties of the tokens generated so far,
// the biases (duplicate ids summed), the constraint's allowed tokens and top_logprobs.
TEST(Sampler, PicksCarryPenaltiesBiasesAndTheMask) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.top_logprobs = 2;
  p.logit_bias = {{4, 1.f}, {2, -3.f}, {4, 0.5f}};
  Sampler s(p, std::make_shared<OnlyTokens>(std::vector<int32_t>{1, 3, 70}));
  TokenPick first = s.next_pick(80);
  EXPECT_TRUE(first.penalties.empty());
  ASSERT_EQ(first.biases.size(), 2u);
  EXPECT_EQ(first.biases[0].id, 4);
  EXPECT_EQ(first.biases[0].delta, 1.5f);
  EXPECT_EQ(first.biases[1].id, 2);
  EXPECT_EQ(first.top_logprobs, 2);
  ASSERT_EQ(first.allowed.size(), 2u) << "80 tokens: two words";
  EXPECT_EQ(first.allowed[0], (uint64_t(1) << 1) | (uint64_t(1) << 3));
  EXPECT_EQ(first.allowed[1], uint64_t(1) << (70 - 64));
  first.token = 1;
  first.logprob = -0.25f;
  first.top = {{1, -0.25f}, {3, -1.5f}};
  const GeneratedToken got = s.accept(first);
  EXPECT_EQ(got.id, 1);
  EXPECT_EQ(got.logprob, -0.25f);
  ASSERT_EQ(got.top.size(), 2u);
  EXPECT_EQ(got.top[1].id, 3);
  TokenPick again = first;
  again.token = 1;
  s.accept(again);
  again.token = 3;
  s.accept(again);
  TokenPick next = s.next_pick(80);
  std::map<int32_t, float> penalties;
  for (const LogitShift& x : next.penalties) penalties[x.id] = x.delta;
  EXPECT_EQ(penalties, (std::map<int32_t, float>{{1, -(0.5f + 0.25f * 2)}, {3, -(0.5f + 0.25f)}}));
}

// The host's draw of a pick is the pipeline TokenPick states: mask, logprobs from the masked logits,
// penalties then biases, then the draw.
TEST(Sampler, HostDrawOfAPickFollowsThePipeline) {
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 3;
  p.frequency_penalty = 2.5f;
  Sampler s(p, std::make_shared<OnlyTokens>(std::vector<int32_t>{1, 2, 3}));
  // kLogits = {0, 3, 1, 2, -1}: 1 first; then 1 pays 2.5 (3 → 0.5) and 3 (2) wins; then 1 and 3 are both
  // penalised (0.5 and -0.5) and 2 (1) wins.
  std::vector<int32_t> ids;
  for (int i = 0; i < 3; ++i) {
    const GeneratedToken t = s.sample(kLogits, s.next_pick(5));
    ids.push_back(t.id);
    double z = std::exp(3.0) + std::exp(1.0) + std::exp(2.0);
    EXPECT_NEAR(t.logprob, double(kLogits[size_t(t.id)]) - std::log(z), 1e-6) << "the masked model's logprob";
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].id, 1);
    EXPECT_EQ(t.top[2].id, 2);
  }
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 2}));
}

// The repetition penalty divides a seen token's positive logit and multiplies a negative one; the prompt's
// tokens count as seen from the start, generated ones as they come.
TEST(Sampler, RepetitionPenaltyCoversPromptAndGeneratedTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.f;
  const std::vector<float> logits = {0.f, 3.f, 1.f, 2.f, -1.f};
  const std::vector<int32_t> prompt = {1};
  Sampler s(p, nullptr, prompt);
  // 1 (a prompt token: 3 → 1.5) falls below 3 (2): 3 first; then 3 is seen too (2 → 1) and 1 (1.5) wins,
  // and keeps winning: the penalty does not grow with repeats (unlike frequency_penalty).
  std::vector<int32_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(s.sample(logits).id);
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 1, 1, 1}));
  const TokenPick pick = s.next_pick(5);
  EXPECT_EQ(pick.repetition_penalty, 2.f);
  EXPECT_EQ(std::set<int32_t>(pick.repeated.begin(), pick.repeated.end()), (std::set<int32_t>{1, 3}));
  // A negative logit of a seen token is multiplied: −1 · 2 = −2 keeps 4 below everything.
  SamplingParams q = p;
  Sampler negative(q, nullptr, std::vector<int32_t>{0, 1, 2, 3});
  const std::vector<float> low = {-3.f, -3.f, -3.f, -3.f, -4.f};
  EXPECT_EQ(negative.sample(low).id, 4) << "−4 unseen beats −6";
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
    const TokenPick pick = picked.next_pick(int64_t(kLogits.size()));
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
  TokenPick pick = greedy.next_pick(int64_t(kLogits.size()));
  EXPECT_EQ(pick.u, 0.0);
  pick.token = 3;
  EXPECT_EQ(greedy.accept(pick).id, 3);
}

}  // namespace
}  // namespace spw::runtime
