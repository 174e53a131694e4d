// Step planning and prefill piece boundaries (src/runtime/step_plan.h), the sampler's
// determinism and filters (src/runtime/sampler.h), and the prefix cache's keying and eviction.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "model/cpu_runner.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"
#include "runtime/step_plan.h"

namespace spw::runtime {
namespace {

std::vector<int64_t> pieces(int64_t done, int64_t n, int64_t chunk, int64_t block) {
  std::vector<int64_t> ends;
  while (done < n) {
    done = next_prefill_end(done, n, chunk, block);
    ends.push_back(done);
  }
  return ends;
}

TEST(RuntimeStepPlan, PrefillPiecesNeverLeaveOneToken) {
  for (int64_t chunk : {16, 32, 256})
    for (int64_t n = 1; n < 700; ++n)
      for (int64_t start : {int64_t(0), std::min<int64_t>(max_cached_prefix(n) / 16 * 16, n - 1)}) {
        const auto ends = pieces(start, n, chunk, 16);
        ASSERT_FALSE(ends.empty());
        EXPECT_EQ(ends.back(), n);
        int64_t prev = start;
        for (int64_t e : ends) {
          EXPECT_GT(e, prev);
          EXPECT_LE(e - prev, chunk);
          if (e != n && e != n - 2) { EXPECT_EQ(e % 16, 0) << "n=" << n << " chunk=" << chunk; }
          if (n >= 2) { EXPECT_GE(e - prev, 2) << "n=" << n << " start=" << start << " chunk=" << chunk; }
          prev = e;
        }
        // The last aligned boundary leaving ≥ 2 tokens is always a piece end (prefix-cache snapshot).
        const int64_t last_aligned = n >= 2 ? (n - 2) / 16 * 16 : 0;
        if (last_aligned > start) { EXPECT_NE(std::find(ends.begin(), ends.end(), last_aligned), ends.end()); }
      }
}

TEST(RuntimeStepPlan, DecodesFirstThenPrefillsInOrderUnderBudget) {
  std::vector<PlanEntry> e = {{false, 30}, {true, 1}, {false, 20}, {true, 1}, {false, 5}};
  StepPlan p = plan_step(e, 8, 40, 0);
  EXPECT_EQ(p.members, (std::vector<size_t>{1, 3, 0}));  // 2 decodes + 30; the 20-token piece waits (FIFO)
  EXPECT_EQ(p.n_tokens, 32);
  p = plan_step(e, 8, 100, 0);
  EXPECT_EQ(p.members, (std::vector<size_t>{1, 3, 0, 2, 4}));
  // An over-budget first piece still runs when nothing else does.
  std::vector<PlanEntry> big = {{false, 500}};
  EXPECT_EQ(plan_step(big, 8, 64, 0).members, (std::vector<size_t>{0}));
}

// A decode that verifies drafts counts its whole input (the last token and the drafts) against the budget,
// and still leaves the waiting prompt's piece its room.
TEST(RuntimeStepPlan, VerifyingDecodesCountTheirDrafts) {
  std::vector<PlanEntry> e = {{true, 6}, {true, 1}, {true, 4}, {false, 30}};
  StepPlan p = plan_step(e, 8, 64, 0);
  EXPECT_EQ(p.members, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.n_tokens, 6 + 1 + 4 + 30);
  EXPECT_TRUE(p.without_drafts.empty());
  // Decodes may take 38 − 30 = 8 tokens: three decodes (3) and the first one's 5 drafts; the third decodes
  // one token without its 3 drafts, and the prompt's piece still goes.
  p = plan_step(e, 8, 38, 0);
  EXPECT_EQ(p.members, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.without_drafts, (std::vector<size_t>{2}));
  EXPECT_EQ(p.n_tokens, 6 + 1 + 1 + 30);
}

TEST(RuntimeStepPlan, DecodeRotationServesEveryone) {
  std::vector<PlanEntry> e(10, PlanEntry{true, 1});
  std::vector<int> served(10, 0);
  for (size_t step = 0; step < 10; ++step)
    for (size_t i : plan_step(e, 3, 100, step).members) ++served[i];
  for (int s : served) EXPECT_EQ(s, 3);
}

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 3);
  std::vector<float> l(n);
  for (auto& x : l) x = d(g);
  return l;
}

TEST(RuntimeSampler, SameSeedSameTokensDifferentSeedDiffers) {
  const auto logits = random_logits(1000, 1);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(a.sample(logits).id);
    tb.push_back(b.sample(logits).id);
    tc.push_back(c.sample(logits).id);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(RuntimeSampler, GreedyTopKMinPTopP) {
  auto logits = random_logits(500, 2);
  const int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 3;
  Sampler greedy(p);
  GeneratedToken t = greedy.sample(logits);
  EXPECT_EQ(t.id, best);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].id, best);
  EXPECT_FLOAT_EQ(t.top[0].logprob, t.logprob);
  EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
  double z = 0;
  for (float l : logits) z += std::exp(double(l) - logits[best]);
  EXPECT_NEAR(t.logprob, -std::log(z), 1e-5);

  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  p.temperature = 1.5f;
  p.top_k = 5;
  p.seed = 7;
  Sampler topk(p);
  for (int i = 0; i < 200; ++i) {
    const int32_t id = topk.sample(logits).id;
    EXPECT_NE(std::find(order.begin(), order.begin() + 5, id), order.begin() + 5);
  }
  p.top_k = 0;
  p.top_p = 1e-6f;  // only the most likely survives
  Sampler nucleus(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(nucleus.sample(logits).id, best);
  p.top_p = 1;
  p.min_p = 0.999f;
  Sampler minp(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(minp.sample(logits).id, best);
}

TEST(RuntimeSampler, FrequencyPenaltyAvoidsRepeats) {
  std::vector<float> logits(50, 0.f);
  logits[3] = 1.0f;
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 2.0f;
  Sampler s(p);
  std::set<int32_t> seen;
  for (int i = 0; i < 10; ++i) seen.insert(s.sample(logits).id);
  EXPECT_GT(seen.size(), 1u);
}

TEST(RuntimePrefixCache, LongestVerifiedPrefixAndLruEviction) {
  SequenceState state;
  state.layers.resize(1);
  state.layers[0].window.assign(1000, 1.f);
  CpuSequence s(state);
  const size_t one = s.nbytes() + 64 * sizeof(int32_t);
  PrefixCache cache(16, one * 3);
  std::vector<int32_t> tokens(64);
  std::iota(tokens.begin(), tokens.end(), 0);
  for (int n : {16, 32, 48}) {
    s.state.n_past = n;
    cache.insert(std::span<const int32_t>(tokens).first(size_t(n)), s);
  }
  auto [len, out] = cache.lookup(tokens, 62);
  EXPECT_EQ(len, 48);
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->n_past(), 48);
  EXPECT_EQ(cache.lookup(tokens, 40).first, 32);
  auto miss = cache.lookup(tokens, 15);
  EXPECT_EQ(miss.first, 0);
  EXPECT_EQ(miss.second, nullptr);
  auto other = tokens;
  other[20] = 999;  // diverges inside block 2: only the first block matches
  EXPECT_EQ(cache.lookup(other, 64).first, 16);
  // A fourth snapshot evicts the least recently used (48 was used after 16... then 16 again).
  s.state.n_past = 64;
  cache.insert(tokens, s);
  EXPECT_LE(cache.nbytes(), one * 3);
  EXPECT_EQ(cache.lookup(tokens, 64).first, 64);
}

// A runner with a few slots for copies (the GPU runner): the cache keeps at most that many, evicting the least
// recently used before it copies, so a copy never waits for a slot an old entry holds.
TEST(RuntimePrefixCache, AtMostMaxEntriesCopies) {
  CpuSequence s(SequenceState{});
  PrefixCache cache(16, size_t(1) << 30, 2);
  std::vector<int32_t> tokens(64);
  std::iota(tokens.begin(), tokens.end(), 0);
  for (int n : {16, 32, 48}) {
    s.state.n_past = n;
    cache.insert(std::span<const int32_t>(tokens).first(size_t(n)), s);
    EXPECT_LE(cache.n_entries(), 2u);
  }
  EXPECT_EQ(cache.n_entries(), 2u);
  EXPECT_EQ(cache.lookup(tokens, 64).first, 48);
  EXPECT_EQ(cache.lookup(tokens, 47).first, 32);
  EXPECT_EQ(cache.lookup(tokens, 31).first, 0) << "the oldest entry (16 tokens) was evicted";
  PrefixCache none(16, size_t(1) << 30, 0);
  none.insert(std::span<const int32_t>(tokens).first(16), s);
  EXPECT_EQ(none.n_entries(), 0u);
}

// evict_oldest drops the least recently used copy, passing over those that begin the tokens to keep.
TEST(RuntimePrefixCache, EvictOldestKeepsTheCopiesOfARequestsPrefix) {
  CpuSequence s(SequenceState{});
  PrefixCache cache(16, size_t(1) << 30);
  std::vector<int32_t> a(32), b(32, 5);
  std::iota(a.begin(), a.end(), 100);
  for (auto* t : {&a, &b})
    for (int n : {16, 32}) {
      s.state.n_past = n;
      cache.insert(std::span<const int32_t>(*t).first(size_t(n)), s);
    }
  ASSERT_EQ(cache.n_entries(), 4u);
  // a's two copies are the oldest; keeping a's prefix evicts b's, then nothing more.
  EXPECT_TRUE(cache.evict_oldest(a));
  EXPECT_TRUE(cache.evict_oldest(a));
  EXPECT_FALSE(cache.evict_oldest(a));
  EXPECT_EQ(cache.n_entries(), 2u);
  EXPECT_EQ(cache.lookup(a, 32).first, 32);
  EXPECT_EQ(cache.lookup(b, 32).first, 0);
  EXPECT_TRUE(cache.evict_oldest());
  EXPECT_EQ(cache.lookup(a, 32).first, 32) << "the lookup made a's 32-token copy the most recent";
  EXPECT_EQ(cache.n_entries(), 1u);
}

// insert makes room without dropping the copies a queued prompt begins with: with two slots holding the shared
// prefix's copy and an older one, inserts drop the older one, then are refused while only the kept copy could go;
// without the queued prompt the same insert drops it.
TEST(RuntimePrefixCache, InsertKeepsTheCopiesOfQueuedPrompts) {
  CpuSequence s(SequenceState{});
  PrefixCache cache(16, size_t(1) << 30, 2);
  std::vector<int32_t> shared(48), other(16, 7);
  std::iota(shared.begin(), shared.end(), 100);
  s.state.n_past = 32;
  cache.insert(std::span<const int32_t>(shared).first(32), s);
  s.state.n_past = 16;
  cache.insert(other, s);
  ASSERT_EQ(cache.lookup(shared, 48).first, 32);  // the shared copy is now the most recent, `other` the oldest
  const std::vector<std::span<const int32_t>> queued = {std::span<const int32_t>(shared)};
  std::vector<int32_t> own1(shared), own2(shared);
  own1.insert(own1.end(), 16, 1), own2.insert(own2.end(), 16, 2);
  s.state.n_past = 64;
  cache.insert(own1, s, queued);  // drops `other`
  EXPECT_EQ(cache.n_entries(), 2u);
  EXPECT_EQ(cache.lookup(other, 16).first, 0);
  // own1's copy is now newer than the shared one, which is the oldest, but the queued prompt keeps it.
  cache.insert(own2, s, queued);  // may drop own1's copy only
  EXPECT_EQ(cache.n_entries(), 2u);
  EXPECT_EQ(cache.lookup(shared, 48).first, 32) << "the queued prompt's copy was dropped";
  EXPECT_EQ(cache.lookup(own2, 64).first, 64);
  // Both remaining copies kept: the insert stores nothing.
  std::vector<int32_t> own3(shared);
  own3.insert(own3.end(), 16, 3);
  const std::vector<std::span<const int32_t>> both = {std::span<const int32_t>(shared), std::span<const int32_t>(own2)};
  cache.insert(own3, s, both);
  EXPECT_EQ(cache.lookup(own3, 64).first, 32) << "stored although every copy it could drop is kept";
  EXPECT_EQ(cache.lookup(own2, 64).first, 64);
  // Nothing queued: the least recently used copy goes.
  cache.insert(own3, s);
  EXPECT_EQ(cache.lookup(own3, 64).first, 64);
  EXPECT_EQ(cache.n_entries(), 2u);
}

// A runner that cannot copy its states (clone() == nullptr) caches nothing.
TEST(RuntimePrefixCache, StatesThatCannotBeCopiedAreNotCached) {
  struct Uncopyable final : RunnerSequence {
    int64_t n_past() const override { return 16; }
    std::unique_ptr<RunnerSequence> clone() const override { return nullptr; }
    size_t nbytes() const override { return 100; }
  };
  PrefixCache cache(16, size_t(1) << 20);
  std::vector<int32_t> tokens(16, 7);
  cache.insert(tokens, Uncopyable{});
  EXPECT_EQ(cache.n_entries(), 0u);
  EXPECT_EQ(cache.lookup(tokens, 16).first, 0);
}

}  // namespace
}  // namespace spw::runtime

namespace spw::runtime {
namespace {

TEST(RuntimeStepPlan, ManyDecodesStillLeaveRoomForAPrefillPiece) {
  std::vector<PlanEntry> e(40, PlanEntry{true, 1});
  e.push_back({false, 16});
  const StepPlan p = plan_step(e, 64, 40, 0);
  EXPECT_EQ(p.members.back(), 40u);  // the prompt's piece is in
  EXPECT_LE(p.n_tokens, 40);
}

}  // namespace
}  // namespace spw::runtime
