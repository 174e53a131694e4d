// GpuModel::truncate (src/engine/gpu_rollback.cpp) on the golden tiny configs: a forward of drafted tokens
// kept for rollback, taken back to each position, then decoded on, gives bit-identical logits (memcmp) to
// a sequence that was only given the kept tokens. With the GEMV forced and the MoE dispatched on the
// device every row is computed from its own inputs in an order that does not depend on the chunk
// (tests/gpu/test_engine_chunks.cpp), so any difference is a state that was not put back: a ring row, a
// compressor slot or previous group, the Engram history or V4.1's published index layer. The prompts put
// the span across the window ring's wrap and, for V4, the ratio-128 group ending at position 255. Then
// speculative decoding through the scheduler on the GPU runner: greedy output with drafts equals greedy
// output without.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../golden/golden_fixture.h"
#include "engine/gpu_model.h"
#include "engine/gpu_runner.h"
#include "gpu_test_util.h"
#include "runtime/scheduler.h"

namespace spw {
namespace {

constexpr int kMaxRollback = 10;

std::unique_ptr<engine::GpuModel> load_gpu(const std::string& arch, const Numerics& numerics) {
  engine::GpuModelOptions opts;
  opts.budget.max_context = 1024;
  opts.budget.max_seqs = 2;
  opts.budget.max_step_tokens = 16;
  opts.budget.max_step_rows = 16;
  opts.budget.max_rollback_tokens = kMaxRollback;
  opts.linear_path = LinearPath::kGemv;
  opts.moe_dispatch = engine::MoeDispatch::kDevice;
  auto m = engine::load_gpu_model(golden::fixture_dir(arch) + "/model", numerics, opts);
  if (!m.ok()) ADD_FAILURE() << arch << ": " << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

std::vector<int32_t> random_tokens(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = int32_t(gen() % uint32_t(vocab));
  return ids;
}

// The prompt in pieces of 16 (the budget's step), then `more` as one forward.
engine::GpuSequence fed(engine::GpuModel& m, const std::vector<int32_t>& prompt, std::span<const int32_t> more,
                        bool keep_rollback) {
  auto s = m.new_sequence();
  EXPECT_TRUE(s.ok()) << s.error().message;
  engine::GpuSequence seq = std::move(s.value());
  for (size_t i = 0; i < prompt.size(); i += 16) {
    auto r = m.forward(seq, std::span<const int32_t>(prompt).subspan(i, std::min<size_t>(16, prompt.size() - i)));
    EXPECT_TRUE(r.ok()) << r.error().message;
  }
  if (!more.empty()) {
    seq.keep_rollback = keep_rollback;
    auto r = m.forward(seq, more);
    EXPECT_TRUE(r.ok()) << r.error().message;
    seq.keep_rollback = false;
  }
  return seq;
}

void truncate_equals_kept(const std::string& arch, const Numerics& numerics, size_t n_prompt, bool one_token_kept) {
  SPW_REQUIRE_GPU();
  auto m = load_gpu(arch, numerics);
  ASSERT_TRUE(m);
  const int64_t vocab = m->config().vocab_size;
  const auto prompt = random_tokens(n_prompt, vocab, 31);
  const auto draft = random_tokens(9, vocab, 32);
  const auto after = random_tokens(3, vocab, 33);
  for (size_t kept = 0; kept <= draft.size(); ++kept) {
    if (kept == 1 && !one_token_kept) continue;
    const std::string where = arch + " prompt " + std::to_string(n_prompt) + " keeping " + std::to_string(kept);
    engine::GpuSequence taken = fed(*m, prompt, draft, true);
    const Status st = m->truncate(taken, int64_t(n_prompt + kept));
    ASSERT_TRUE(st.ok()) << where << ": " << st.error().message;
    ASSERT_EQ(taken.n_past, int64_t(n_prompt + kept));
    engine::GpuSequence plain = fed(*m, prompt, std::span<const int32_t>(draft).first(kept), false);
    EXPECT_EQ(taken.published_index_k_layer, plain.published_index_k_layer) << where;
    EXPECT_EQ(taken.engram_recent, plain.engram_recent) << where;
    for (int32_t t : after) {
      auto a = m->forward(taken, std::span<const int32_t>(&t, 1));
      auto b = m->forward(plain, std::span<const int32_t>(&t, 1));
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_EQ(a->size(), b->size());
      ASSERT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << where << ": decoding on differs";
    }
  }
}

TEST(EngineRollback, V4TruncateEqualsForwardingTheKeptTokens) {
  truncate_equals_kept("v4", Numerics::reference(), 150, true);
  truncate_equals_kept("v4", Numerics::reference(), 250, true);
}

TEST(EngineRollback, V41TruncateEqualsForwardingTheKeptTokens) {
  Numerics n = Numerics::reference();
  n.stale_index_k = false;
  truncate_equals_kept("v41", n, 150, true);
  truncate_equals_kept("v41", n, 251, true);
  truncate_equals_kept("v41", Numerics::reference(), 250, false);  // the quirk: a lone kept token is a decode step
}

TEST(EngineRollback, RefusesWhatTheLogCannotTakeBack) {
  SPW_REQUIRE_GPU();
  auto m = load_gpu("v4", Numerics::reference());
  ASSERT_TRUE(m);
  const auto tokens = random_tokens(40, m->config().vocab_size, 5);
  engine::GpuSequence seq = fed(*m, std::vector<int32_t>(tokens.begin(), tokens.begin() + 10), {}, false);
  EXPECT_FALSE(m->truncate(seq, 9).ok()) << "no forward kept a log";
  seq.keep_rollback = true;
  ASSERT_TRUE(m->forward(seq, std::span<const int32_t>(tokens).subspan(10, 5)).ok());
  EXPECT_FALSE(m->truncate(seq, 9).ok()) << "before the logged forward's start";
  EXPECT_FALSE(m->truncate(seq, 16).ok()) << "past the sequence's end";
  EXPECT_TRUE(m->truncate(seq, 12).ok());
  auto r = m->forward(seq, std::span<const int32_t>(tokens).subspan(12, kMaxRollback + 1));
  ASSERT_FALSE(r.ok()) << "a logged forward is bounded by the budget's max_rollback_tokens";
  EXPECT_EQ(seq.n_past, 12);
  seq.keep_rollback = false;
  ASSERT_TRUE(m->forward(seq, std::span<const int32_t>(tokens).subspan(12, 2)).ok());
  EXPECT_FALSE(m->truncate(seq, 13).ok()) << "a forward without the log drops it";
}

// Through the scheduler on the GPU runner: drafts from single-token matches (min_ngram 1, so the random
// fixture drafts often and most drafts are rejected), verified and taken back; greedy output equals the
// same runner without speculation.
TEST(EngineRollback, SchedulerSpeculationOnTheGpuRunnerChangesNoGreedyOutput) {
  SPW_REQUIRE_GPU();
  for (const std::string arch : {"v4", "v41"}) {
    engine::GpuRunnerSettings settings;
    settings.budget.max_seqs = 4;
    settings.budget.max_context = 512;
    settings.budget.max_step_tokens = 64;
    settings.budget.max_rollback_tokens = 6;
    settings.numerics = Numerics::reference();
    settings.numerics.stale_index_k = false;
    settings.prefix_cache_slots = 0;
    auto runner = engine::load_gpu_runner(golden::fixture_dir(arch) + "/model", settings);
    ASSERT_TRUE(runner.ok()) << runner.error().message;
    std::vector<runtime::GenerationRequest> reqs;
    for (uint32_t i = 0; i < 6; ++i) {
      runtime::GenerationRequest r;
      r.prompt = random_tokens(20 + 7 * i, (*runner)->config().vocab_size, 40 + i);
      r.sampling.temperature = 0;
      r.max_tokens = 40;
      r.ignore_eos = true;
      reqs.push_back(r);
    }
    std::vector<std::vector<int32_t>> out[2];
    uint64_t drafted = 0, accepted = 0;
    for (int spec = 0; spec < 2; ++spec) {
      runtime::SchedulerSettings s;
      s.prefix_cache_nbytes = 0;
      s.max_num_seqs = 4;
      s.max_batch = 4;
      s.kv_tokens = 2048;
      if (spec) {
        s.speculative.mode = runtime::SpeculativeMode::ngram;
        s.speculative.ngram.min_ngram = 1;
      }
      runtime::Scheduler sched(**runner, s);
      std::vector<std::shared_ptr<runtime::RequestStream>> streams;
      for (const auto& r : reqs) streams.push_back(sched.submit(r).stream);
      for (auto& st : streams) {
        std::vector<int32_t> ids;
        for (;;) {
          runtime::StreamUpdate u = st->wait(std::chrono::milliseconds(100));
          for (const auto& t : u.tokens) ids.push_back(t.id);
          if (u.finish != runtime::FinishReason::none) break;
        }
        out[spec].push_back(ids);
      }
      if (spec) drafted = sched.metrics().spec_drafted, accepted = sched.metrics().spec_accepted;
    }
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(out[1][i], out[0][i]) << arch << " request " << i;
    std::printf("[ measured ] %s on the GPU runner: %llu drafted, %llu accepted\n", arch.c_str(),
                (unsigned long long)drafted, (unsigned long long)accepted);
    EXPECT_GT(drafted, accepted) << "no draft rejected: the rollback went untested";
  }
}

}  // namespace
}  // namespace spw
#endif
