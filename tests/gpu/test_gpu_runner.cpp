// The GPU runner (engine/gpu_runner.h) and what it adds to GpuModel, on the golden tiny configs
// (tests/golden/fixtures/{v4,v41}):
//  - GpuModel::copy_sequence: a copy made after a prompt (its pages, compressor partial groups and host
//    bookkeeping) continues exactly as the original: the same tokens give bit-identical logits on both
//    (memcmp), for prompts ending inside a compressor group and after several of them;
//  - GpuRunner::forward against the CPU runner on the same inputs (mixed decode and prefill inputs in one
//    step): greedy tokens equal, or the CPU's top two logits within a stated tolerance where they differ
//    (the engine differs from the reference by f32 summation order, src/engine/gpu_model.h);
//  - its argument errors, which leave every sequence as it was.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "../golden/golden_fixture.h"
#include "engine/gpu_model.h"
#include "engine/gpu_runner.h"
#include "gpu_test_util.h"
#include "model/cpu_runner.h"

namespace spw {
namespace {

std::unique_ptr<engine::GpuModel> load_gpu(const std::string& arch, int max_seqs) {
  engine::GpuModelOptions opts;
  opts.budget.max_context = 1024;
  opts.budget.max_seqs = max_seqs;
  auto m = engine::load_gpu_model(golden::fixture_dir(arch) + "/model", Numerics::reference(), opts);
  if (!m.ok()) ADD_FAILURE() << arch << ": " << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

void copy_continues_like_the_original(const std::string& arch) {
  SPW_REQUIRE_GPU();
  auto m = load_gpu(arch, 4);
  ASSERT_TRUE(m);
  const int V = int(m->config().vocab_size);
  for (int prompt_len : {5, 37, 130}) {
    auto a = m->new_sequence();
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(m->forward(*a, gpu_test::lcg_tokens(prompt_len, 11, V)).ok());
    auto b = m->copy_sequence(*a);
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_EQ(b->n_past, a->n_past);
    EXPECT_EQ(m->sequence_nbytes(*b), m->sequence_nbytes(*a));
    // A prefill piece, then decode tokens, on each.
    const auto more = gpu_test::lcg_tokens(9, 12, V);
    ForwardOptions all;
    all.all_logits = true;
    auto la = m->forward(*a, std::span<const int32_t>(more).first(6), all);
    auto lb = m->forward(*b, std::span<const int32_t>(more).first(6), all);
    ASSERT_TRUE(la.ok() && lb.ok());
    ASSERT_EQ(la->size(), lb->size());
    EXPECT_EQ(std::memcmp(la->data(), lb->data(), la->size() * sizeof(float)), 0)
        << arch << " prompt " << prompt_len << ": the copy's prefill logits differ";
    for (int t = 6; t < 9; ++t) {
      auto da = m->forward(*a, std::span<const int32_t>(more).subspan(t, 1));
      auto db = m->forward(*b, std::span<const int32_t>(more).subspan(t, 1));
      ASSERT_TRUE(da.ok() && db.ok());
      EXPECT_EQ(std::memcmp(da->data(), db->data(), da->size() * sizeof(float)), 0)
          << arch << " prompt " << prompt_len << ": decode step " << t << " differs";
    }
  }
}

TEST(GpuRunner, V41CopyContinuesLikeTheOriginal) { copy_continues_like_the_original("v41"); }
TEST(GpuRunner, V4CopyContinuesLikeTheOriginal) { copy_continues_like_the_original("v4"); }

TEST(GpuRunner, CopyNeedsAFreeSlot) {
  SPW_REQUIRE_GPU();
  auto m = load_gpu("v41", 1);
  ASSERT_TRUE(m);
  auto a = m->new_sequence();
  ASSERT_TRUE(a.ok());
  const auto pages = m->kv_pages();
  EXPECT_GT(pages.used, 0);
  auto b = m->copy_sequence(*a);
  EXPECT_FALSE(b.ok()) << "one slot: a copy cannot have one";
  EXPECT_EQ(m->kv_pages().used, pages.used) << "a failed copy takes no pages";
}

// Tolerance: where greedy tokens differ, the CPU's top-two gap must be below this (logit units); the golden
// tests bound the engine's logit differences on these models far below it.
constexpr float kNearTie = 0.05f;

void runner_matches_cpu_runner(const std::string& arch) {
  SPW_REQUIRE_GPU();
  auto cpu_model = load_model(golden::fixture_dir(arch) + "/model", Numerics::reference());
  ASSERT_TRUE(cpu_model.ok()) << cpu_model.error().message;
  CpuRunner cpu(**cpu_model);
  engine::GpuRunnerSettings gs;
  gs.budget.max_seqs = 4;
  gs.budget.max_context = 1024;
  gs.prefix_cache_slots = 2;
  auto gpu = engine::load_gpu_runner(golden::fixture_dir(arch) + "/model", gs);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  EXPECT_EQ((*gpu)->max_sequences(), 4);
  EXPECT_EQ((*gpu)->max_cached_states(), 2);
  const int V = int(cpu.config().vocab_size);
  std::vector<std::unique_ptr<RunnerSequence>> cs, gsq;
  for (int i = 0; i < 3; ++i) {
    cs.push_back(std::move(cpu.new_sequence().value()));
    auto g = (*gpu)->new_sequence();
    ASSERT_TRUE(g.ok()) << g.error().message;
    gsq.push_back(std::move(g.value()));
  }
  std::vector<std::vector<int32_t>> next(3);
  const int prompt_lens[3] = {7, 20, 33};
  for (int step = 0; step < 6; ++step) {
    std::vector<std::vector<int32_t>> toks(3);
    std::vector<RunnerInput> ci(3), gi(3);
    for (int i = 0; i < 3; ++i) {
      // Sequence i prefills its prompt at step i (so steps mix prefill pieces and decodes), then decodes.
      if (step < i) continue;
      toks[i] = step == i ? gpu_test::lcg_tokens(prompt_lens[i], 30 + i, V) : next[i];
      ci[i] = {cs[i].get(), toks[i], false};
      gi[i] = {gsq[i].get(), toks[i], false};
    }
    std::vector<RunnerInput> cin, gin;
    std::vector<int> who;
    for (int i = 0; i < 3; ++i)
      if (!toks[i].empty()) {
        cin.push_back(ci[i]);
        gin.push_back(gi[i]);
        who.push_back(i);
      }
    auto cl = cpu.forward(cin);
    auto gl = (*gpu)->forward(gin);
    ASSERT_TRUE(cl.ok() && gl.ok()) << (cl.ok() ? gl.error().message : cl.error().message);
    for (size_t k = 0; k < who.size(); ++k) {
      const auto& c = (*cl)[k];
      const auto& g = (*gl)[k];
      ASSERT_EQ(c.size(), size_t(V));
      ASSERT_EQ(g.size(), size_t(V));
      const int32_t tc = int32_t(std::max_element(c.begin(), c.end()) - c.begin());
      const int32_t tg = int32_t(std::max_element(g.begin(), g.end()) - g.begin());
      if (tc != tg) {
        std::vector<float> sorted = c;
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        EXPECT_LT(sorted[0] - sorted[1], kNearTie) << arch << " seq " << who[k] << " step " << step << ": CPU " << tc
                                                   << ", GPU " << tg << " without a near tie";
      }
      next[who[k]] = {tc};  // both continue with the reference's token
    }
  }
  // Errors leave every sequence as it was.
  const int64_t before = gsq[0]->n_past();
  const int32_t bad = V;
  RunnerInput wrong[2] = {{gsq[0].get(), std::span<const int32_t>(next[0]), false}, {gsq[1].get(), {&bad, 1}, false}};
  EXPECT_FALSE((*gpu)->forward(wrong).ok());
  EXPECT_EQ(gsq[0]->n_past(), before);
  RunnerInput twice[2] = {{gsq[0].get(), std::span<const int32_t>(next[0]), false},
                          {gsq[0].get(), std::span<const int32_t>(next[0]), false}};
  EXPECT_FALSE((*gpu)->forward(twice).ok());
  EXPECT_EQ(gsq[0]->n_past(), before);
  RunnerInput foreign[1] = {{cs[0].get(), std::span<const int32_t>(next[0]), false}};
  EXPECT_FALSE((*gpu)->forward(foreign).ok());
  // A clone holds a slot of its own and continues like the original.
  auto copy = gsq[2]->clone();
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->n_past(), gsq[2]->n_past());
  EXPECT_GT(copy->nbytes(), 0u);
}

TEST(GpuRunner, V41MatchesTheCpuRunner) { runner_matches_cpu_runner("v41"); }
TEST(GpuRunner, V4MatchesTheCpuRunner) { runner_matches_cpu_runner("v4"); }

}  // namespace
}  // namespace spw
#endif
