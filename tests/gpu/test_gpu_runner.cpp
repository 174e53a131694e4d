// The GPU runner (engine/gpu_runner.h) and what it adds to GpuModel, on the golden tiny configs
// (tests/golden/fixtures/{v4,v41}):
//  - GpuModel::copy_sequence: a copy made after a prompt (its pages, compressor partial groups and host
//    bookkeeping) continues exactly as the original: the same tokens give bit-identical logits on both
//    (memcmp), for prompts ending inside a compressor group and after several of them;
//  - GpuRunner::forward against GpuModel on each sequence alone (mixed decode and prefill inputs in one step; prompt
//    pieces on the row-invariant prefill path, the rest through forward()): bit-identical logits;
//  - its argument errors, which leave every sequence as it was;
//  - pools smaller than every slot at max_context: kv_can_hold says exactly what forward() can take;
//  - token picks drawn on the device agree with the logits;
//  - without batch invariance, prefill pieces run together and each input gets its own logits; with it, every
//    input of a step (prompts, verified drafts, decodes) gets the bits it gets alone.
#if defined(SPW_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "../golden/golden_fixture.h"
#include "cuda/attn/kv_pages.h"
#include "engine/gpu_model.h"
#include "engine/gpu_runner.h"
#include "runtime/sampler.h"
#include "gpu_test_util.h"

namespace spw {
namespace {

std::unique_ptr<engine::GpuModel> load_gpu(const std::string& arch, int max_seqs, bool share_kv_pages = false) {
  engine::GpuModelOptions opts;
  opts.budget.max_context = 1024;
  opts.budget.max_seqs = max_seqs;
  opts.share_kv_pages = share_kv_pages;
  auto m = engine::load_gpu_model(golden::fixture_dir(arch) + "/model", Numerics::reference(), opts);
  if (!m.ok()) ADD_FAILURE() << arch << ": " << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

int64_t pages_of(const engine::GpuSequence& s) {
  int64_t n = 0;
  for (const auto* lists : {&s.ring_pages, &s.comp_pages, &s.key_pages})
    for (const auto& pages : *lists) n += int64_t(pages.size());
  return n;
}

// Pages of `b`'s lists that are `a`'s own (the same page ids, position by position).
int64_t pages_in_common(const engine::GpuSequence& a, const engine::GpuSequence& b) {
  int64_t n = 0;
  for (auto lists : {std::pair{&a.ring_pages, &b.ring_pages}, std::pair{&a.comp_pages, &b.comp_pages},
                     std::pair{&a.key_pages, &b.key_pages}})
    for (size_t l = 0; l < lists.first->size(); ++l)
      for (size_t i = 0; i < std::min((*lists.first)[l].size(), (*lists.second)[l].size()); ++i)
        n += (*lists.first)[l][i] == (*lists.second)[l][i];
  return n;
}

// The full pages of compressed entries (and of index keys, where the layer has them) that a copy shares:
// every page all of whose rows hold an entry of the first n_past positions.
int64_t full_compressed_pages(const engine::GpuModel& m, const engine::GpuSequence& s) {
  int64_t n = 0;
  for (int l = 0; l < m.config().n_layers; ++l) {
    const int r = m.config().layers[l].compress_ratio;
    if (r == 0) continue;
    const int64_t full = s.n_past / r / cuda::kKvPageRows;
    n += std::min<int64_t>(full, int64_t(s.comp_pages[l].size())) +
         std::min<int64_t>(full, int64_t(s.key_pages[l].size()));
  }
  return n;
}

// With share_kv_pages the copy takes none of the original's full pages of compressed entries and index keys
// (the first appear at 130 positions on V4.1's ratio-2 layers, at 300 on the ratio-4 layers), and the results
// are the same.
void copy_continues_like_the_original(const std::string& arch, bool share_kv_pages = false) {
  SPW_REQUIRE_GPU();
  auto m = load_gpu(arch, 4, share_kv_pages);
  ASSERT_TRUE(m);
  const int V = int(m->config().vocab_size);
  for (int prompt_len : {5, 37, 130, 300}) {
    auto a = m->new_sequence();
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(m->forward(*a, gpu_test::lcg_tokens(prompt_len, 11, V)).ok());
    const int64_t used = m->kv_pages().used;
    auto b = m->copy_sequence(*a);
    ASSERT_TRUE(b.ok()) << b.error().message;
    const int64_t taken = m->kv_pages().used - used;
    const int64_t shared = pages_in_common(*a, *b);
    EXPECT_EQ(shared, share_kv_pages ? full_compressed_pages(*m, *a) : 0) << arch << " prompt " << prompt_len;
    if (share_kv_pages && prompt_len == 300) { EXPECT_GT(shared, 0) << arch << ": no page shared"; }
    EXPECT_EQ(taken, pages_of(*a) - shared) << arch << " prompt " << prompt_len;
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
TEST(GpuRunner, V41SharedCopyContinuesLikeTheOriginal) { copy_continues_like_the_original("v41", true); }
TEST(GpuRunner, V4SharedCopyContinuesLikeTheOriginal) { copy_continues_like_the_original("v4", true); }

// Shared pages outlive the sequence that made them: with the original freed and its other pages reused by a
// new sequence, the copy continues exactly as a sequence fed the same tokens from scratch.
TEST(GpuRunner, V41SharedPagesOutliveTheirSource) {
  SPW_REQUIRE_GPU();
  auto m = load_gpu("v41", 4, true);
  ASSERT_TRUE(m);
  const int V = int(m->config().vocab_size);
  const auto prompt = gpu_test::lcg_tokens(300, 21, V), more = gpu_test::lcg_tokens(5, 22, V);
  const int64_t idle = m->kv_pages().used;
  std::optional<engine::GpuSequence> b;
  {
    auto a = m->new_sequence();
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(m->forward(*a, prompt).ok());
    auto copy = m->copy_sequence(*a);
    ASSERT_TRUE(copy.ok());
    b.emplace(std::move(copy.value()));
  }  // a freed: its shared pages stay with b
  auto other = m->new_sequence();
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(m->forward(*other, gpu_test::lcg_tokens(300, 23, V)).ok());  // takes the pages a returned
  auto fresh = m->new_sequence();
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(m->forward(*fresh, prompt).ok());
  for (int t = 0; t < 5; ++t) {
    auto lb = m->forward(*b, std::span<const int32_t>(more).subspan(size_t(t), 1));
    auto lf = m->forward(*fresh, std::span<const int32_t>(more).subspan(size_t(t), 1));
    ASSERT_TRUE(lb.ok() && lf.ok());
    EXPECT_EQ(std::memcmp(lb->data(), lf->data(), lb->size() * sizeof(float)), 0) << "step " << t;
  }
  b.reset();
  other->owner->free_sequence(*other);
  fresh->owner->free_sequence(*fresh);
  EXPECT_EQ(m->kv_pages().used, idle) << "every page returned once no sequence holds it";
}

// Admission's count of a copy (GpuModel::Growth::copy_of) is what copy_sequence takes: with shared pages only
// the window rings and the last partly filled pages, without them every page; and a fresh sequence of the same
// length takes more than a shared copy.
void copy_need_is_what_the_copy_takes(bool share) {
  SCOPED_TRACE(share ? "shared pages" : "copied pages");
  SPW_REQUIRE_GPU();
  auto m = load_gpu("v41", 4, share);
  ASSERT_TRUE(m);
  auto a = m->new_sequence();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(m->forward(*a, gpu_test::lcg_tokens(300, 31, int(m->config().vocab_size))).ok());
  const std::array<engine::GpuModel::Growth, 1> as_copy{engine::GpuModel::Growth{nullptr, a->n_past, &*a}};
  const std::array<engine::GpuModel::Growth, 1> as_new{engine::GpuModel::Growth{nullptr, a->n_past, nullptr}};
  const engine::GpuModel::KvNeed need = m->kv_need(as_copy), fresh = m->kv_need(as_new);
  const int64_t before = m->kv_pages().used;
  auto b = m->copy_sequence(*a);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(m->kv_pages().used - before, need.ring + need.comp + need.keys);
  EXPECT_EQ(need.slots, 1);
  if (share) EXPECT_LT(need.comp + need.keys, fresh.comp + fresh.keys) << "300 positions fill pages to share";
  else EXPECT_EQ(need.comp + need.keys, fresh.comp + fresh.keys);
}
TEST(GpuRunner, V41CopyNeedIsWhatTheCopyTakesShared) { copy_need_is_what_the_copy_takes(true); }
TEST(GpuRunner, V41CopyNeedIsWhatTheCopyTakesCopied) { copy_need_is_what_the_copy_takes(false); }

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

// The runner adds nothing to the engine's numbers: per input, its logits are GpuModel::forward's for that
// sequence alone (bit-identical), with one-token inputs batched into decode calls and prefill pieces beside them.
// (Against the CPU reference: tests/gpu/test_engine_golden.cpp; on these random-weight models a flipped bf16
// rounding grows through the layers, so greedy tokens there are not expected to agree.)
void runner_matches_the_engine_alone(const std::string& arch) {
  SPW_REQUIRE_GPU();
  engine::GpuRunnerSettings gs;
  gs.budget.max_seqs = 4;
  gs.budget.max_context = 1024;
  gs.prefix_cache_slots = 2;
  auto gpu = engine::load_gpu_runner(golden::fixture_dir(arch) + "/model", gs);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  EXPECT_EQ((*gpu)->max_sequences(), 4);
  EXPECT_EQ((*gpu)->max_cached_states(), 2);
  auto alone = load_gpu(arch, 4);
  ASSERT_TRUE(alone);
  const int V = int((*gpu)->config().vocab_size);
  std::vector<std::unique_ptr<RunnerSequence>> rs;
  std::vector<engine::GpuSequence> as;
  for (int i = 0; i < 3; ++i) {
    auto r = (*gpu)->new_sequence();
    ASSERT_TRUE(r.ok()) << r.error().message;
    rs.push_back(std::move(r.value()));
    auto a = alone->new_sequence();
    ASSERT_TRUE(a.ok()) << a.error().message;
    as.push_back(std::move(a.value()));
  }
  std::vector<std::vector<int32_t>> next(3);
  const int prompt_lens[3] = {7, 20, 33};
  for (int step = 0; step < 6; ++step) {
    std::vector<std::vector<int32_t>> toks(3);
    std::vector<RunnerInput> in;
    std::vector<int> who;
    for (int i = 0; i < 3; ++i) {
      // Sequence i prefills its prompt at step i (so steps mix prefill pieces and decodes), then decodes.
      if (step < i) continue;
      toks[i] = step == i ? gpu_test::lcg_tokens(prompt_lens[i], 30 + i, V) : next[i];
      in.push_back({rs[i].get(), toks[i], false});
      who.push_back(i);
    }
    auto got = (*gpu)->forward(in);
    ASSERT_TRUE(got.ok()) << got.error().message;
    for (size_t k = 0; k < who.size(); ++k) {
      const int i = who[k];
      // Alone on the path the batch-invariant runner gives that input: a prompt piece too long to compute as decode
      // rows and shorter than kRowInvariantPieceTokens on the row-invariant prefill path, anything else through
      // forward().
      auto ref = [&]() -> Result<std::vector<float>> {
        const int n = int(toks[i].size());
        if (n == 1 || (*gpu)->model().chunk_computes_as_decode(n) || n >= engine::GpuModel::kRowInvariantPieceTokens)
          return alone->forward(as[size_t(i)], toks[i]);
        const engine::GpuModel::ChunkInput chunk{&as[size_t(i)], toks[i]};
        auto r = alone->forward_chunks(std::span(&chunk, 1), engine::GpuModel::ChunkPath::kRowInvariant);
        if (!r.ok()) return r.error();
        return std::move((*r)[0]);
      }();
      ASSERT_TRUE(ref.ok()) << ref.error().message;
      ASSERT_EQ((*got)[k].size(), ref->size());
      EXPECT_EQ(std::memcmp((*got)[k].data(), ref->data(), ref->size() * sizeof(float)), 0)
          << arch << " seq " << i << " step " << step << ": the runner's logits differ from the engine's alone";
      next[i] = {int32_t(std::max_element(ref->begin(), ref->end()) - ref->begin())};
    }
  }
  // Errors leave every sequence as it was.
  const int64_t before = rs[0]->n_past();
  const int32_t bad = V;
  RunnerInput wrong[2] = {{rs[0].get(), std::span<const int32_t>(next[0]), false}, {rs[1].get(), {&bad, 1}, false}};
  EXPECT_FALSE((*gpu)->forward(wrong).ok());
  EXPECT_EQ(rs[0]->n_past(), before);
  RunnerInput twice[2] = {{rs[0].get(), std::span<const int32_t>(next[0]), false},
                          {rs[0].get(), std::span<const int32_t>(next[0]), false}};
  EXPECT_FALSE((*gpu)->forward(twice).ok());
  EXPECT_EQ(rs[0]->n_past(), before);
  // A clone holds a slot of its own and continues like the original.
  auto copy = rs[2]->clone();
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->n_past(), rs[2]->n_past());
  EXPECT_GT(copy->nbytes(), 0u);
  RunnerInput a[1] = {{rs[2].get(), std::span<const int32_t>(next[2]), false}};
  RunnerInput b[1] = {{copy.get(), std::span<const int32_t>(next[2]), false}};
  auto la = (*gpu)->forward(a);
  auto lb = (*gpu)->forward(b);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(std::memcmp((*la)[0].data(), (*lb)[0].data(), (*la)[0].size() * sizeof(float)), 0);
}

// Pools smaller than every slot at max_context (KvBudget::pool_tokens): kv_can_hold answers exactly what
// forward() can reserve. A sequence grows in prefill pieces while kv_can_hold accepts the next piece;
// the first refused piece makes forward() fail with nothing advanced, and freeing another sequence's
// pages makes it fit again.
void small_pools_hold_what_kv_can_hold_says(const std::string& arch) {
  SPW_REQUIRE_GPU();
  engine::GpuRunnerSettings gs;
  gs.budget.max_seqs = 2;
  gs.budget.max_context = 4096;
  gs.budget.max_step_tokens = 256;
  gs.budget.pool_tokens = 1024;
  auto gpu = engine::load_gpu_runner(golden::fixture_dir(arch) + "/model", gs);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  ModelRunner& r = **gpu;
  const int V = int(r.config().vocab_size);
  auto other = r.new_sequence();
  auto seq = r.new_sequence();
  ASSERT_TRUE(other.ok() && seq.ok());
  const auto piece = gpu_test::lcg_tokens(256, 41, V);
  ASSERT_TRUE(r.forward(std::array{RunnerInput{other->get(), piece, false}}).ok());
  int pieces = 0;
  for (; pieces < 16; ++pieces) {
    const std::array<KvGrowth, 1> g{KvGrowth{seq->get(), (*seq)->n_past() + 256}};
    if (!r.kv_can_hold(g)) break;
    auto out = r.forward(std::array{RunnerInput{seq->get(), piece, false}});
    ASSERT_TRUE(out.ok()) << arch << " piece " << pieces << ": kv_can_hold accepted it: " << out.error().message;
  }
  std::printf("[ measured ] %s: %d pieces of 256 beside one of 256 in pools for 1024 positions (+ a page per sequence "
              "and layer)\n", arch.c_str(), pieces);
  ASSERT_LT(pieces, 16) << "the pools never ran out";
  EXPECT_GE(pieces, 3) << "1024 positions hold at least 3 pieces beside the other sequence's one";
  const int64_t before = (*seq)->n_past();
  auto refused = r.forward(std::array{RunnerInput{seq->get(), piece, false}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("KV"), std::string::npos) << refused.error().message;
  EXPECT_EQ((*seq)->n_past(), before);
  other->reset();
  const std::array<KvGrowth, 1> g{KvGrowth{seq->get(), (*seq)->n_past() + 256}};
  EXPECT_TRUE(r.kv_can_hold(g)) << "the other sequence's pages are free again";
  EXPECT_TRUE(r.forward(std::array{RunnerInput{seq->get(), piece, false}}).ok());
}

TEST(GpuRunner, V41SmallPoolsHoldWhatKvCanHoldSays) { small_pools_hold_what_kv_can_hold_says("v41"); }
TEST(GpuRunner, V4SmallPoolsHoldWhatKvCanHoldSays) { small_pools_hold_what_kv_can_hold_says("v4"); }

// Token picks (TokenPick) are drawn on the device from the same logits: a greedy pick is the argmax of the
// logits the runner returns without a pick (lowest id on ties); a sampled pick with top_k 1 is that argmax too,
// and with top_k 5 one of the five largest; a picked input returns no logits.
// The tiny V4.1 fixture as a runner of max_seqs sequences of 1024 positions, no prefix-cache slots.
std::unique_ptr<engine::GpuRunner> load_v41_runner(int max_seqs) {
  engine::GpuRunnerSettings gs;
  gs.budget.max_seqs = max_seqs;
  gs.budget.max_context = 1024;
  gs.prefix_cache_slots = 0;
  auto gpu = engine::load_gpu_runner(golden::fixture_dir("v41") + "/model", gs);
  if (!gpu.ok()) ADD_FAILURE() << gpu.error().message;
  return gpu.ok() ? std::move(gpu.value()) : nullptr;
}

// The logits of seq's next position after `token`, computed on a copy (seq itself does not advance), and
// the ids in descending logit order (ties: lower id first).
struct NextLogits {
  std::vector<float> logits;
  std::vector<int32_t> order;
};
NextLogits probe_next(ModelRunner& r, const RunnerSequence& seq, const std::vector<int32_t>& token) {
  NextLogits n;
  auto probe = seq.clone();
  if (!probe) {
    ADD_FAILURE() << "no copy of the sequence";
    return n;
  }
  auto out = r.forward(std::array{RunnerInput{probe.get(), token, false}});
  if (!out.ok()) {
    ADD_FAILURE() << out.error().message;
    return n;
  }
  n.logits = std::move((*out)[0]);
  n.order.resize(n.logits.size());
  for (size_t i = 0; i < n.order.size(); ++i) n.order[i] = int32_t(i);
  std::stable_sort(n.order.begin(), n.order.end(),
                   [&](int32_t x, int32_t y) { return n.logits[size_t(x)] > n.logits[size_t(y)]; });
  return n;
}

TEST(GpuRunner, V41PicksAreDrawnFromTheLogits) {
  SPW_REQUIRE_GPU();
  auto gpu = load_v41_runner(4);
  ASSERT_TRUE(gpu);
  ModelRunner& r = *gpu;
  const int V = int(r.config().vocab_size);
  auto a = r.new_sequence();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(r.forward(std::array{RunnerInput{a->get(), gpu_test::lcg_tokens(21, 51, V), false}}).ok());
  const std::vector<int32_t> token = {7};
  for (int trial = 0; trial < 3; ++trial) {
    // The logits of the next position, from a copy (so every pick sees the same state).
    const NextLogits next = probe_next(r, **a, token);
    ASSERT_EQ(next.order.size(), size_t(V));
    const std::vector<int32_t>& order = next.order;
    TokenPick picks[3];
    picks[0].temperature = 0.f;
    picks[1].temperature = 1.f;
    picks[1].top_k = 1;
    picks[1].u = 0.9;
    picks[2].temperature = 0.8f;
    picks[2].top_k = 5;
    picks[2].u = 0.25 * trial + 0.1;
    for (TokenPick& pick : picks) {
      auto copy = (*a)->clone();
      ASSERT_NE(copy, nullptr);
      auto out = r.forward(std::array{RunnerInput{copy.get(), token, false, &pick}});
      ASSERT_TRUE(out.ok()) << out.error().message;
      EXPECT_TRUE((*out)[0].empty()) << "a picked input returns no logits";
      ASSERT_GE(pick.token, 0);
      if (pick.top_k == 5)
        EXPECT_NE(std::find(order.begin(), order.begin() + 5, pick.token), order.begin() + 5) << pick.token;
      else
        EXPECT_EQ(pick.token, order[0]);
    }
    ASSERT_TRUE(r.forward(std::array{RunnerInput{a->get(), token, false}}).ok());
  }
}

// Picks with the sampler's whole pipeline (a mask, repetition penalties, penalties, biases, logprobs), several in one decode
// call, drawn on the device: each is what the server's sampler draws from the logits the runner returns
// for the same state without a pick (runtime::Sampler::sample(logits, pick)); ids exact, logprobs within
// 1e-6 relative (tests/gpu/test_cuda_ops_pick.cpp says why).
TEST(GpuRunner, V41EditedPicksMatchTheHostSampler) {
  SPW_REQUIRE_GPU();
  auto gpu = load_v41_runner(8);
  ASSERT_TRUE(gpu);
  ModelRunner& r = *gpu;
  const int V = int(r.config().vocab_size);
  auto a = r.new_sequence();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(r.forward(std::array{RunnerInput{a->get(), gpu_test::lcg_tokens(33, 52, V), false}}).ok());
  const std::vector<int32_t> token = {11};
  const NextLogits next = probe_next(r, **a, token);
  ASSERT_EQ(next.order.size(), size_t(V));
  const std::vector<float>& l = next.logits;
  const std::vector<int32_t>& order = next.order;
  std::vector<TokenPick> picks(5);
  // 0: greedy, the top two penalised below the third, logprobs with 5 alternatives.
  picks[0].penalties = {{order[0], -50.f}, {order[1], -40.f}};
  picks[0].top_logprobs = 5;
  // 1: greedy, a mask allowing the 10th..30th most likely, a bias lifting the 20th.
  picks[1].allowed.assign(size_t(V + 63) / 64, 0);
  for (int k = 10; k < 30; ++k) picks[1].allowed[size_t(order[size_t(k)]) / 64] |= uint64_t(1) << (order[size_t(k)] % 64);
  picks[1].biases = {{order[20], 30.f}, {order[0], 100.f}};
  picks[1].top_logprobs = 0;
  // 2: sampled, top_k 5, a penalty and a bias on the same token.
  picks[2].temperature = 0.9f;
  picks[2].top_k = 5;
  picks[2].u = 0.7;
  picks[2].penalties = {{order[0], -1.f}};
  picks[2].biases = {{order[0], 0.25f}, {order[3], 2.f}};
  picks[2].top_logprobs = 20;
  // 3: plain greedy beside them.
  // 4: greedy, a repetition penalty of 2 on the top two (and ten others), a penalty on the first of them.
  picks[4].repetition_penalty = 2.f;
  picks[4].repeated = {order[0], order[1]};
  for (int k = 100; k < 110; ++k) picks[4].repeated.push_back(order[size_t(k)]);
  picks[4].penalties = {{order[0], -0.5f}};
  picks[4].top_logprobs = 3;
  std::vector<std::unique_ptr<RunnerSequence>> copies;
  std::vector<RunnerInput> inputs;
  for (TokenPick& pick : picks) {
    copies.push_back((*a)->clone());
    ASSERT_NE(copies.back(), nullptr);
    inputs.push_back(RunnerInput{copies.back().get(), token, false, &pick});
  }
  auto out = r.forward(inputs);
  ASSERT_TRUE(out.ok()) << out.error().message;
  for (size_t k = 0; k < picks.size(); ++k) {
    SCOPED_TRACE(testing::Message() << "pick " << k);
    EXPECT_TRUE((*out)[k].empty()) << "a picked input returns no logits";
    runtime::Sampler host(runtime::SamplingParams{});
    const runtime::GeneratedToken want = host.sample(l, picks[k]);
    EXPECT_EQ(picks[k].token, want.id);
    if (picks[k].top_logprobs < 0) continue;
    EXPECT_NEAR(picks[k].logprob, want.logprob, 1e-6 * std::max(1.f, std::fabs(want.logprob)));
    ASSERT_EQ(picks[k].top.size(), want.top.size());
    for (size_t j = 0; j < want.top.size(); ++j) {
      EXPECT_EQ(picks[k].top[j].id, want.top[j].id) << j;
      EXPECT_NEAR(picks[k].top[j].logprob, want.top[j].logprob, 1e-6 * std::max(1.f, std::fabs(want.top[j].logprob)));
    }
  }
  EXPECT_EQ(picks[0].token, order[2]) << "the two penalised tokens fall below the third";
  EXPECT_EQ(picks[1].token, order[20]) << "the bias lifts the 20th; the 1st stays masked";
}

TEST(GpuRunner, V41MatchesTheEngineAlone) { runner_matches_the_engine_alone("v41"); }
TEST(GpuRunner, V4MatchesTheEngineAlone) { runner_matches_the_engine_alone("v4"); }

// GpuRunner::warm_up (serve runs it before listening) leaves nothing behind: the KV pools are as empty as before,
// and a prompt then gives the bits a runner that never warmed up gives (both batch-invariant, so deterministic).
TEST(GpuRunner, V41WarmUpLeavesNoTrace) {
  SPW_REQUIRE_GPU();
  engine::GpuRunnerSettings gs;
  gs.budget.max_seqs = 4;
  gs.budget.max_context = 512;
  gs.prefix_cache_slots = 0;
  auto warm = engine::load_gpu_runner(golden::fixture_dir("v41") + "/model", gs);
  auto cold = engine::load_gpu_runner(golden::fixture_dir("v41") + "/model", gs);
  ASSERT_TRUE(warm.ok() && cold.ok());
  const int64_t used_before = (*warm)->usage().kv_blocks_used;
  ASSERT_TRUE((*warm)->warm_up().ok());
  EXPECT_EQ((*warm)->usage().kv_blocks_used, used_before);
  const std::vector<int32_t> prompt = gpu_test::lcg_tokens(37, 91, int((*warm)->config().vocab_size));
  std::vector<std::vector<float>> logits;
  for (auto* r : {warm->get(), cold->get()}) {
    auto seq = r->new_sequence();
    ASSERT_TRUE(seq.ok());
    const RunnerInput in[] = {{seq.value().get(), prompt, false}};
    auto out = r->forward(in);
    ASSERT_TRUE(out.ok()) << out.error().message;
    logits.push_back((*out)[0]);
  }
  ASSERT_FALSE(logits[0].empty());
  EXPECT_EQ(logits[0], logits[1]);
}

// Without batch invariance the prefill pieces of a step run together (GpuModel::forward_chunks), in steps of at
// most step_max_rows rows: five pieces (16 + 40 + 90 + 60 + 30 rows, one step of 146 and one of 90 when steps
// hold 150 rows) give each input its own logits, in input order, with the shape it asked for. Checked against
// the same runner given each piece in a call of its own: every piece's first row (position 0, identical inputs up
// to summation order, GEMMs on both sides) within 1e-2, as tests/gpu/test_engine_chunks.cpp bounds it; a piece's
// logits at the wrong index would be another prompt's, far beyond that.
TEST(GpuRunner, V41PrefillPiecesTogetherWithoutBatchInvariance) {
  SPW_REQUIRE_GPU();
  engine::GpuRunnerSettings gs;
  gs.budget.max_seqs = 6;
  gs.budget.max_context = 1024;
  gs.budget.max_step_tokens = 128;
  gs.budget.max_step_rows = 150;
  gs.prefix_cache_slots = 0;
  gs.batch_invariant = false;
  auto together = engine::load_gpu_runner(golden::fixture_dir("v41") + "/model", gs);
  ASSERT_TRUE(together.ok()) << together.error().message;
  auto alone = engine::load_gpu_runner(golden::fixture_dir("v41") + "/model", gs);
  ASSERT_TRUE(alone.ok()) << alone.error().message;
  const int V = int((*together)->config().vocab_size);
  const int lens[] = {16, 40, 90, 60, 30};
  std::vector<std::vector<int32_t>> toks;
  std::vector<std::unique_ptr<RunnerSequence>> ts, as;
  std::vector<RunnerInput> tin, ain;
  for (int i = 0; i < 5; ++i) toks.push_back(gpu_test::lcg_tokens(lens[i], 70 + i, V));
  for (int i = 0; i < 5; ++i) {
    auto t = (*together)->new_sequence();
    auto a = (*alone)->new_sequence();
    ASSERT_TRUE(t.ok() && a.ok());
    ts.push_back(std::move(t.value()));
    as.push_back(std::move(a.value()));
    tin.push_back({ts.back().get(), toks[size_t(i)], i % 2 == 1});
    ain.push_back({as.back().get(), toks[size_t(i)], i % 2 == 1});
  }
  auto got = (*together)->forward(tin);
  ASSERT_TRUE(got.ok()) << got.error().message;
  std::vector<std::vector<float>> want;
  for (const RunnerInput& in : ain) {
    auto r = (*alone)->forward(std::span<const RunnerInput>(&in, 1));
    ASSERT_TRUE(r.ok()) << r.error().message;
    want.push_back(std::move((*r)[0]));
  }
  for (int i = 0; i < 5; ++i) {
    const size_t rows = i % 2 == 1 ? size_t(lens[i]) : 1;
    ASSERT_EQ((*got)[size_t(i)].size(), rows * size_t(V)) << "input " << i;
    ASSERT_EQ(want[size_t(i)].size(), rows * size_t(V)) << "input " << i;
    EXPECT_EQ(ts[size_t(i)]->n_past(), lens[i]);
    if (rows == 1) continue;  // only all-logits pieces have a position-0 row
    float first_row = 0;
    for (int v = 0; v < V; ++v)
      first_row = std::max(first_row, std::fabs((*got)[size_t(i)][size_t(v)] - want[size_t(i)][size_t(v)]));
    std::printf("  [runner pieces together] input %d (%d tokens): position 0 max |dlogit| %.3g\n", i, lens[i],
                first_row);
    EXPECT_LE(first_row, 1e-2f) << "input " << i;
  }
}

// With batch invariance every input of a step gets the bits it gets alone. Two batch-invariant runners take the
// same inputs, one all in one call, the other one input per call, and must agree bit for bit (memcmp):
//  - six prompts (5, 37, 130, 64, 9 and 300 tokens, all logits): the 5-token one runs as decode rows
//    (GpuModel::chunk_computes_as_decode), those of 9, 37 and 64 together on the row-invariant prefill path, those
//    of 130 and 300 (at least GpuModel::kRowInvariantPieceTokens) each alone on forward();
//  - then a piece of each (2, 6, 3, 40, 5, 4 tokens, all logits: verified drafts) — five together as decode rows,
//    the 40-token one on the prefill path;
//  - then one decode token each (one decode call of six rows against six of one).
// Why exact: every kernel of those paths computes each row from that row alone (gpu_runner.h).
void pieces_together_as_alone(const std::string& arch) {
  SPW_REQUIRE_GPU();
  engine::GpuRunnerSettings gs;
  gs.budget.max_seqs = 8;
  gs.budget.max_context = 1024;
  gs.prefix_cache_slots = 0;
  gs.batch_invariant = true;
  auto together = engine::load_gpu_runner(golden::fixture_dir(arch) + "/model", gs);
  ASSERT_TRUE(together.ok()) << together.error().message;
  auto alone = engine::load_gpu_runner(golden::fixture_dir(arch) + "/model", gs);
  ASSERT_TRUE(alone.ok()) << alone.error().message;
  const int V = int((*together)->config().vocab_size);
  const int prompt_lens[] = {5, 37, 130, 64, 9, 300}, piece_lens[] = {2, 6, 3, 40, 5, 4};
  std::vector<std::unique_ptr<RunnerSequence>> ts, as;
  for (int i = 0; i < 6; ++i) {
    auto t = (*together)->new_sequence();
    auto a = (*alone)->new_sequence();
    ASSERT_TRUE(t.ok() && a.ok());
    ts.push_back(std::move(t.value()));
    as.push_back(std::move(a.value()));
  }
  int small = 0;
  for (int n : piece_lens) small += (*together)->model().chunk_computes_as_decode(n);
  EXPECT_EQ(small, 5) << "every piece but the one of 40 rows runs as decode rows";
  // One round: inputs[i] of tokens[i] to sequence i, all in one call on `together`, one per call on `alone`.
  auto round = [&](const char* what, const std::vector<std::vector<int32_t>>& tokens, bool all_logits) {
    std::vector<RunnerInput> tin;
    for (int i = 0; i < 6; ++i) tin.push_back({ts[size_t(i)].get(), tokens[size_t(i)], all_logits});
    auto got = (*together)->forward(tin);
    ASSERT_TRUE(got.ok()) << what << ": " << got.error().message;
    for (int i = 0; i < 6; ++i) {
      const RunnerInput ain{as[size_t(i)].get(), tokens[size_t(i)], all_logits};
      auto want = (*alone)->forward(std::span<const RunnerInput>(&ain, 1));
      ASSERT_TRUE(want.ok()) << what << ": " << want.error().message;
      const std::vector<float>& g = (*got)[size_t(i)], &w = (*want)[0];
      ASSERT_EQ(g.size(), w.size()) << arch << " " << what << " " << i;
      ASSERT_FALSE(w.empty());
      EXPECT_EQ(std::memcmp(g.data(), w.data(), w.size() * sizeof(float)), 0)
          << arch << " " << what << " " << i << " (" << tokens[size_t(i)].size() << " tokens) differs from alone";
    }
  };
  std::vector<std::vector<int32_t>> prompts, pieces, decode;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(gpu_test::lcg_tokens(prompt_lens[i], 40 + i, V));
    pieces.push_back(gpu_test::lcg_tokens(piece_lens[i], 90 + i, V));
    decode.push_back({int32_t((17 * i + 5) % V)});
  }
  round("prompt", prompts, true);
  round("piece", pieces, true);
  round("decode", decode, false);
}

TEST(GpuRunner, V41PiecesTogetherAsAlone) { pieces_together_as_alone("v41"); }
TEST(GpuRunner, V4PiecesTogetherAsAlone) { pieces_together_as_alone("v4"); }

}  // namespace
}  // namespace spw
#endif
