// The scheduler (src/runtime/scheduler.h) on the tiny V4.1 fixture with reference numerics (the
// stale-index-key decode quirk on): greedy outputs of many concurrent requests equal the same
// requests run alone, prefix-cache hits change nothing, a tiny KV capacity queues instead of
// failing, a full queue refuses, and cancellation frees a sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <utility>
#include <thread>

#include "formats/safetensors.h"
#include "model/cpu_runner.h"
#include "runtime/scheduler.h"

namespace spw::runtime {
namespace {

std::string fixture() { return std::string(SPW_SOURCE_DIR) + "/tests/golden/fixtures/v41/model"; }

class RuntimeScheduler : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = load_model(fixture(), Numerics::reference());
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(m.value()).release();
    runner_ = new CpuRunner(*model_);
  }
  static void TearDownTestSuite() {
    delete runner_;
    runner_ = nullptr;
    delete model_;
    model_ = nullptr;
  }
  static Model* model_;
  static CpuRunner* runner_;
};
Model* RuntimeScheduler::model_ = nullptr;
CpuRunner* RuntimeScheduler::runner_ = nullptr;

GenerationRequest greedy(std::vector<int32_t> prompt, int n) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = n;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> collect(RequestStream& s, FinishReason* reason = nullptr) {
  std::vector<int32_t> ids;
  for (;;) {
    StreamUpdate u = s.wait(std::chrono::milliseconds(100));
    for (const auto& t : u.tokens) ids.push_back(t.id);
    if (u.finish != FinishReason::none) {
      if (reason) *reason = u.finish;
      return ids;
    }
  }
}

std::vector<std::vector<int32_t>> prompts(int n) {
  std::mt19937 g(3);
  std::vector<int32_t> shared(37);
  for (auto& t : shared) t = int32_t(3 + g() % 1000);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = {0};
    if (i % 2) p.insert(p.end(), shared.begin(), shared.end());
    for (unsigned k = 0, m = 2 + g() % 30; k < m; ++k) p.push_back(int32_t(3 + g() % 1000));
    out.push_back(p);
  }
  return out;
}

TEST_F(RuntimeScheduler, ConcurrentEqualsAloneAndPrefixCacheChangesNothing) {
  const auto ps = prompts(12);
  // Alone, no prefix cache, one-shot prefill.
  std::vector<std::vector<int32_t>> alone;
  {
    SchedulerSettings s;
    s.prefix_cache_nbytes = 0;
    Scheduler sched(*runner_, s);
    for (const auto& p : ps) {
      auto sub = sched.submit(greedy(p, 5));
      ASSERT_EQ(sub.code, SubmitCode::ok) << sub.message;
      alone.push_back(collect(*sub.stream));
    }
  }
  // All at once, small pieces, tight budget, batch smaller than the running set, prefix cache on.
  SchedulerSettings s;
  s.prefill_chunk = 16;
  s.step_token_budget = 24;
  s.max_batch = 5;
  Scheduler sched(*runner_, s);
  for (int round = 0; round < 2; ++round) {  // round 2 hits the cache everywhere
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& p : ps) {
      auto sub = sched.submit(greedy(p, 5));
      ASSERT_EQ(sub.code, SubmitCode::ok);
      streams.push_back(sub.stream);
    }
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(collect(*streams[i]), alone[i]) << "round " << round << " request " << i;
  }
  const SchedulerSnapshot m = sched.metrics();
  std::printf("[ measured ] prompt tokens %llu, cached %llu\n", (unsigned long long)m.prompt_tokens,
              (unsigned long long)m.prompt_tokens_cached);
  EXPECT_GT(m.prompt_tokens_cached, 0u);
}

// A prompt with two image spans (tests/golden/fixtures/v41/cases/images.safetensors), prefilled in 16-token
// pieces that cut the first span, gives the greedy tokens of one Model::forward of it; a second request
// with other rows for its images, under the same token ids, gives its own (the prefix cache keys image
// positions by content), and repeating the first gives the first's again from the cache.
TEST_F(RuntimeScheduler, ImagePromptsInPiecesMatchTheModel) {
  auto file = SafetensorsFile::open(std::string(SPW_SOURCE_DIR) + "/tests/golden/fixtures/v41/cases/images.safetensors");
  ASSERT_TRUE(file.ok()) << file.error().message;
  std::vector<int32_t> prompt;
  for (float v : tensor_floats(*(*file)->find("prompt_ids"))) prompt.push_back(int32_t(v));
  const TensorInfo* mask = (*file)->find("is_image");
  ASSERT_TRUE(mask);
  const std::vector<uint8_t> is_image(mask->data, mask->data + mask->numel());
  const std::vector<float> rows = tensor_floats(*(*file)->find("image_rows"));
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < is_image.size(); ++i)
    if (is_image[i] && (i == 0 || !is_image[i - 1])) spans.push_back({i, 0});
    else if (!is_image[i] && i > 0 && is_image[i - 1]) spans.back().second = i - spans.back().first;
  ASSERT_EQ(spans.size(), 2u);

  auto images = [&](const std::vector<float>& r, uint64_t hash) {
    auto p = std::make_shared<PromptImages>();
    p->is_image = is_image;
    p->rows = r;
    p->d_model = model_->config().d_model;
    p->cache_key = image_cache_key(prompt, spans, std::vector<uint64_t>{hash, hash + 1});
    return p;
  };
  auto direct = [&](const PromptImages& im, int n) {
    SequenceState seq = model_->new_sequence();
    std::vector<int32_t> out;
    auto logits = model_->forward(seq, prompt, {}, im.slice(0, prompt.size()));
    EXPECT_TRUE(logits.ok());
    for (int k = 0; k < n && logits.ok(); ++k) {
      out.push_back(int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin()));
      logits = model_->forward(seq, std::span<const int32_t>(&out.back(), 1));
    }
    return out;
  };
  std::vector<float> other_rows = rows;
  for (float& v : other_rows) v = -v;
  const auto a = images(rows, 11), b = images(other_rows, 22);
  const auto want_a = direct(*a, 5), want_b = direct(*b, 5);
  ASSERT_NE(want_a, want_b);  // else the second request could not show a wrongly shared cache entry

  SchedulerSettings s;
  s.prefill_chunk = 16;
  s.step_token_budget = 24;
  Scheduler sched(*runner_, s);
  for (const auto& [im, want] : {std::pair{a, want_a}, std::pair{b, want_b}, std::pair{a, want_a}}) {
    GenerationRequest r = greedy(prompt, 5);
    r.images = im;
    auto sub = sched.submit(std::move(r));
    ASSERT_EQ(sub.code, SubmitCode::ok) << sub.message;
    EXPECT_EQ(collect(*sub.stream), want);
  }
  EXPECT_GT(sched.metrics().prompt_tokens_cached, 0u);  // the repeat of `a` started from the cache

  GenerationRequest bad = greedy(prompt, 2);
  auto short_mask = std::make_shared<PromptImages>(*a);
  short_mask->is_image.pop_back();
  bad.images = short_mask;
  EXPECT_EQ(sched.submit(std::move(bad)).code, SubmitCode::invalid);
}

TEST_F(RuntimeScheduler, FullQueueRefusesTooLargeRejected) {
  SchedulerSettings s;
  s.kv_tokens = 40;
  s.max_num_seqs = 1;
  s.max_queue = 2;
  CpuRunner tiny(*model_, s.kv_tokens);
  Scheduler sched(tiny, s);
  auto big = sched.submit(greedy({0, 1, 2}, 50));
  EXPECT_EQ(big.code, SubmitCode::too_large);
  EXPECT_NE(big.message.find("--kv-tokens"), std::string::npos);
  std::vector<std::shared_ptr<RequestStream>> ok;
  for (int i = 0; i < 3; ++i) {  // one seat: one runs, two wait
    auto sub = sched.submit(greedy({0, 5, 6, 7, int32_t(8 + i)}, 20));
    ASSERT_EQ(sub.code, SubmitCode::ok) << i;
    ok.push_back(sub.stream);
  }
  auto over = sched.submit(greedy({0, 5}, 5));
  EXPECT_EQ(over.code, SubmitCode::queue_full);
  EXPECT_NE(over.message.find("--max-queue"), std::string::npos);
  for (auto& st : ok) {
    FinishReason r;
    EXPECT_EQ(collect(*st, &r).size(), 20u);
    EXPECT_EQ(r, FinishReason::length);
  }
  EXPECT_TRUE(sched.idle());
  EXPECT_EQ(sched.metrics().requests_rejected, 1u);
}

// Admission by the KV the runner actually holds: more sequences start than prompt + max_tokens would
// allow, the pool runs out as they grow, the newest are preempted and recomputed (prompt prefilled
// again, generated tokens replayed as decodes), and every greedy output is what it is with no limit.
// With the prefix cache on, its copies are dropped before anything is preempted.
TEST_F(RuntimeScheduler, KvExhaustionPreemptsAndChangesNoOutput) {
  const auto ps = prompts(8);
  constexpr int kTokens = 40;
  std::vector<std::vector<int32_t>> alone;
  {
    SchedulerSettings s;
    s.prefix_cache_nbytes = 0;
    Scheduler sched(*runner_, s);
    for (const auto& p : ps) alone.push_back(collect(*sched.submit(greedy(p, kTokens)).stream));
  }
  for (const bool cache : {false, true}) {
    SchedulerSettings s;
    s.kv_tokens = 160;  // 10 blocks of 16: each request ends at 43-78 positions (3-5 blocks)
    s.prefill_chunk = 16;
    s.step_token_budget = 32;
    if (!cache) s.prefix_cache_nbytes = 0;
    CpuRunner tiny(*model_, s.kv_tokens);
    {
      Scheduler sched(tiny, s);
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (const auto& p : ps) {
        auto sub = sched.submit(greedy(p, kTokens));
        ASSERT_EQ(sub.code, SubmitCode::ok) << sub.message;
        streams.push_back(sub.stream);
      }
      for (size_t i = 0; i < ps.size(); ++i) {
        FinishReason r = FinishReason::none;
        EXPECT_EQ(collect(*streams[i], &r), alone[i]) << "cache " << cache << " request " << i;
        EXPECT_EQ(r, FinishReason::length);
      }
      const SchedulerSnapshot m = sched.metrics();
      std::printf("[ measured ] cache %d: preemptions %llu, prefill tokens %llu (prompts %llu), cached %llu\n", cache,
                  (unsigned long long)m.preemptions, (unsigned long long)m.prefill_tokens,
                  (unsigned long long)m.prompt_tokens, (unsigned long long)m.prompt_tokens_cached);
      EXPECT_GT(m.preemptions, 0u);
      EXPECT_EQ(m.requests_finished, ps.size());
      EXPECT_LE(m.runner.kv_blocks_used, m.runner.kv_blocks_total);
      for (int i = 0; i < 100 && !sched.idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      EXPECT_TRUE(sched.idle());
    }
    EXPECT_EQ(tiny.usage().kv_blocks_used, 0) << "every block returns once the scheduler and its cache are gone";
  }
}

TEST_F(RuntimeScheduler, CancelFreesTheSequence) {
  SchedulerSettings s;
  Scheduler sched(*runner_, s);
  auto sub = sched.submit(greedy({0, 9, 9}, 100000));
  ASSERT_EQ(sub.code, SubmitCode::ok);
  while (sub.stream->wait(std::chrono::milliseconds(50)).tokens.empty()) {
  }
  sub.stream->cancel();
  FinishReason r = FinishReason::none;
  collect(*sub.stream, &r);
  EXPECT_EQ(r, FinishReason::cancelled);
  for (int i = 0; i < 100 && !sched.idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(sched.idle());
  EXPECT_EQ(sched.submit(greedy({0, 1}, 0)).code, SubmitCode::invalid);
  EXPECT_EQ(sched.submit(greedy({0, 5000}, 1)).code, SubmitCode::invalid);
}

}  // namespace
}  // namespace spw::runtime

namespace spw::runtime {
namespace {

// The CPU runner with the GPU runner's slot discipline: at most `running + cached` sequences alive at once
// (new_sequence and clone fail past that), max_sequences() = running, max_cached_states() = cached.
class SlotLimitedRunner final : public ModelRunner {
 public:
  SlotLimitedRunner(CpuRunner& inner, int running, int cached) : inner_(inner), running_(running), cached_(cached) {}

  struct Seq final : RunnerSequence {
    Seq(SlotLimitedRunner& r, std::unique_ptr<RunnerSequence> s) : owner(r), inner(std::move(s)) { ++owner.alive; }
    ~Seq() override { --owner.alive; }
    int64_t n_past() const override { return inner->n_past(); }
    std::unique_ptr<RunnerSequence> clone() const override {
      if (owner.alive >= owner.running_ + owner.cached_) return nullptr;
      return std::make_unique<Seq>(owner, inner->clone());
    }
    size_t nbytes() const override { return inner->nbytes(); }
    SlotLimitedRunner& owner;
    std::unique_ptr<RunnerSequence> inner;
  };

  const ModelConfig& config() const override { return inner_.config(); }
  std::string_view device() const override { return "cpu"; }
  int64_t max_context() const override { return 0; }
  int max_sequences() const override { return running_; }
  int max_cached_states() const override { return cached_; }
  Result<std::unique_ptr<RunnerSequence>> new_sequence() override {
    if (alive >= running_ + cached_) return make_error("all ", running_ + cached_, " slots in use");
    auto s = inner_.new_sequence();
    if (!s.ok()) return s.error();
    return std::unique_ptr<RunnerSequence>(std::make_unique<Seq>(*this, std::move(s.value())));
  }
  Result<std::vector<std::vector<float>>> forward(std::span<const RunnerInput> inputs) override {
    std::vector<RunnerInput> in(inputs.begin(), inputs.end());
    for (auto& i : in) i.seq = static_cast<Seq*>(i.seq)->inner.get();
    return inner_.forward(in);
  }

  int alive = 0;

 private:
  CpuRunner& inner_;
  int running_, cached_;
};

// With slots for only a few cached copies beside the running sequences, the prefix cache still hits, never takes
// a running sequence's slot (no request fails), and changes no output.
TEST_F(RuntimeScheduler, PrefixCacheWithinTheRunnersSlots) {
  const auto ps = prompts(12);
  SlotLimitedRunner limited(*runner_, 4, 2);
  std::vector<std::vector<int32_t>> alone;
  {
    SchedulerSettings s;
    s.prefix_cache_nbytes = 0;
    Scheduler sched(*runner_, s);
    for (const auto& p : ps) alone.push_back(collect(*sched.submit(greedy(p, 5)).stream));
  }
  SchedulerSettings s;
  s.prefill_chunk = 16;
  s.step_token_budget = 24;
  Scheduler sched(limited, s);
  EXPECT_EQ(sched.settings().max_num_seqs, 4);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& p : ps) streams.push_back(sched.submit(greedy(p, 5)).stream);
    for (size_t i = 0; i < ps.size(); ++i) {
      FinishReason r = FinishReason::none;
      EXPECT_EQ(collect(*streams[i], &r), alone[i]) << "round " << round << " request " << i;
      EXPECT_EQ(r, FinishReason::length);
    }
  }
  const SchedulerSnapshot m = sched.metrics();
  std::printf("[ measured ] prompt tokens %llu, cached %llu, cache entries %llu\n",
              (unsigned long long)m.prompt_tokens, (unsigned long long)m.prompt_tokens_cached,
              (unsigned long long)m.prefix_cache_entries);
  EXPECT_GT(m.prompt_tokens_cached, 0u);
  EXPECT_LE(m.prefix_cache_entries, 2u);
}

// A burst sharing a cached prefix, larger than the running seats, with slots for two cached copies: the first
// members' own prompt copies (their prompts are whole blocks) do not push out the shared prefix's copy while
// members still wait for it, so every member starts from it.
TEST_F(RuntimeScheduler, ABurstKeepsTheSharedPrefixItWaitsFor) {
  SlotLimitedRunner limited(*runner_, 4, 2);
  SchedulerSettings s;
  s.prefill_chunk = 16;
  Scheduler sched(limited, s);
  std::vector<int32_t> shared = {0};
  for (int i = 1; i < 32; ++i) shared.push_back(3 + 11 * i);
  const auto with_own = [&](int k) {
    std::vector<int32_t> p = shared;
    for (int i = 0; i < 16; ++i) p.push_back(500 + 16 * k + i);
    return p;
  };
  collect(*sched.submit(greedy(with_own(0), 2)).stream);  // primes the copies after 32 and 48 tokens
  const uint64_t cached_before = sched.metrics().prompt_tokens_cached;
  constexpr int kBurst = 12;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int k = 1; k <= kBurst; ++k) streams.push_back(sched.submit(greedy(with_own(k), 2)).stream);
  for (auto& st : streams) {
    FinishReason r = FinishReason::none;
    EXPECT_EQ(collect(*st, &r).size(), 2u);
    EXPECT_EQ(r, FinishReason::length);
  }
  EXPECT_EQ(sched.metrics().prompt_tokens_cached - cached_before, uint64_t(kBurst) * shared.size())
      << "burst members that found the shared prefix's copy gone";
}

// The CPU runner, recording the new sequences' growths the scheduler asks kv_can_hold about: (n_total, the
// positions of the copy it names as the source, −1 for none).
class GrowthRecordingRunner final : public ModelRunner {
 public:
  explicit GrowthRecordingRunner(CpuRunner& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::string_view device() const override { return "cpu"; }
  int64_t max_context() const override { return 0; }
  int max_sequences() const override { return 0; }
  bool kv_can_hold(std::span<const KvGrowth> growth) const override {
    std::lock_guard lock(mutex);
    for (const KvGrowth& g : growth)
      if (!g.seq) asked.push_back({g.n_total, g.copy_of ? g.copy_of->n_past() : -1});
    return inner_.kv_can_hold(growth);
  }
  Result<std::unique_ptr<RunnerSequence>> new_sequence() override { return inner_.new_sequence(); }
  Result<std::vector<std::vector<float>>> forward(std::span<const RunnerInput> inputs) override {
    return inner_.forward(inputs);
  }
  std::vector<std::pair<int64_t, int64_t>> take() {
    std::lock_guard lock(mutex);
    return std::exchange(asked, {});
  }

 private:
  CpuRunner& inner_;
  mutable std::mutex mutex;
  mutable std::vector<std::pair<int64_t, int64_t>> asked;
};

// Admission names the cached copy a request will start from (KvGrowth::copy_of), so a runner that shares
// memory with copies can count it as held: a prompt whose first 32 tokens are cached is admitted as a copy of
// that 32-position state; a request for prompt logprobs (which prefills all of its prompt) names none; and
// the prefix cache's own copies are asked about as copies of the sequence they copy.
TEST_F(RuntimeScheduler, AdmissionNamesTheCachedCopyARequestStartsFrom) {
  GrowthRecordingRunner recording(*runner_);
  SchedulerSettings s;
  s.prefix_block = 16;
  s.prefill_chunk = 16;
  Scheduler sched(recording, s);
  std::vector<int32_t> prompt = {0};
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + 7 * i);
  collect(*sched.submit(greedy(prompt, 2)).stream);
  const auto first = recording.take();
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first.front(), std::make_pair(int64_t(prompt.size()), int64_t(-1))) << "nothing cached yet";
  bool copies_asked = false;  // the cache's copies after 16 and 32 prompt tokens
  for (const auto& [n_total, source] : first) copies_asked = copies_asked || (n_total == 32 && source == 32);
  EXPECT_TRUE(copies_asked);

  std::vector<int32_t> longer = prompt;
  longer.push_back(999);
  collect(*sched.submit(greedy(longer, 2)).stream);
  const auto second = recording.take();
  ASSERT_FALSE(second.empty());
  EXPECT_EQ(second.front(), std::make_pair(int64_t(longer.size()), int64_t(32)))
      << "admitted as a copy of the 32-token prefix's state";

  GenerationRequest scored = greedy(longer, 2);
  scored.prompt_logprobs = true;
  collect(*sched.submit(std::move(scored)).stream);
  const auto third = recording.take();
  ASSERT_FALSE(third.empty());
  EXPECT_EQ(third.front(), std::make_pair(int64_t(longer.size()), int64_t(-1))) << "prompt logprobs: no copy";
}

}  // namespace
}  // namespace spw::runtime
