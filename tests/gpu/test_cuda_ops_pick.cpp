// The device pick pipeline (engine/token_picks.h over cuda/ops/pick_logits.h, then argmax or
// cuda::sample) against the server's sampler (runtime::Sampler::sample(logits, pick), the host's draw
// of the same TokenPick): masks, repetition penalties (above and below 1), penalties then biases (ids in
// all three), logprobs with top lists, greedy
// and sampled rows mixed in one call, masks that leave one token, rows without edits.
// Shapes: V4.1's vocabulary 129280 with 1..64 rows, and vocabularies 7 and 1023.
// Tolerance: token ids and top-list ids exactly; logprobs within 1e-6 relative (both are
// float(double(l) − log Z) with log Z in f64; only the order of the f64 sum differs).
#if defined(SPW_HAVE_CUDA)
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "cuda/ops/sampling.h"
#include "engine/token_picks.h"
#include "runtime/sampler.h"
#include "test_cuda_ops_util.h"

namespace spw {
namespace {

using cuda_test::Guarded;

std::vector<LogitShift> random_shifts(std::mt19937& rng, int64_t vocab, int n, float scale) {
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<LogitShift> out;
  for (int i = 0; i < std::min<int>(n, int(vocab)); ++i) out.push_back({ids[size_t(i)], nd(rng)});
  return out;
}

// Row r's pick: a mix of every feature, cycled over the rows.
TokenPick make_pick(std::mt19937& rng, int64_t vocab, int64_t r) {
  TokenPick p;
  const int kind = int(r % 6);
  p.temperature = kind % 2 ? 0.8f + 0.1f * float(kind) : 0.f;
  p.top_k = kind == 3 ? 40 : 0;
  p.top_p = kind == 5 ? 0.9f : 1.f;
  p.min_p = kind == 1 ? 0.02f : 0.f;
  p.u = double(rng() >> 5) * 0x1.0p-27;
  if (kind != 4) {
    p.penalties = random_shifts(rng, vocab, kind == 0 ? 3000 : 40, 2.f);
    p.biases = random_shifts(rng, vocab, 20, 5.f);
    // Some ids in both: the penalty lands first.
    for (size_t j = 0; j < std::min<size_t>(5, p.penalties.size()); ++j) p.biases.push_back({p.penalties[j].id, 3.f});
    std::sort(p.biases.begin(), p.biases.end(), [](auto a, auto b) { return a.id < b.id; });
    p.biases.erase(std::unique(p.biases.begin(), p.biases.end(), [](auto a, auto b) { return a.id == b.id; }),
                   p.biases.end());
  }
  if (kind == 0 || kind == 3) {  // repeated ids: random ones and the first penalised and biased ones
    p.repetition_penalty = kind == 0 ? 1.3f : 0.7f;
    for (const LogitShift& s : random_shifts(rng, vocab, 500, 1.f)) p.repeated.push_back(s.id);
    for (size_t j = 0; j < std::min<size_t>(5, p.penalties.size()); ++j) p.repeated.push_back(p.penalties[j].id);
    std::sort(p.repeated.begin(), p.repeated.end());
    p.repeated.erase(std::unique(p.repeated.begin(), p.repeated.end()), p.repeated.end());
  }
  if (kind == 2 || kind == 3 || kind == 5) {
    p.allowed.assign(size_t(vocab + 63) / 64, 0);
    const int64_t keep_one = int64_t(rng() % uint64_t(vocab));
    for (int64_t id = 0; id < vocab; ++id)
      if (kind == 5 ? id == keep_one : rng() % 3 == 0 || id == keep_one) p.allowed[size_t(id / 64)] |= uint64_t(1) << (id % 64);
  }
  const int tops[] = {-1, 0, 5, 20, 1, 3};
  p.top_logprobs = tops[(r / 6 + kind) % 6];
  return p;
}

bool close(float a, float b) { return std::fabs(a - b) <= 1e-6f * std::max(1.f, std::fabs(b)); }

void pick_case(int64_t rows, int64_t vocab, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows=" << rows << " vocab=" << vocab << " seed=" << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(size_t(rows * vocab));
  for (float& v : logits) v = std::round(nd(rng) * 64.f) / 64.f;  // some ties
  std::vector<TokenPick> picks;
  for (int64_t r = 0; r < rows; ++r) picks.push_back(make_pick(rng, vocab, r));

  // The host: the server's sampler draws each pick from its row.
  std::vector<runtime::GeneratedToken> want;
  for (int64_t r = 0; r < rows; ++r) {
    runtime::Sampler host(runtime::SamplingParams{});
    want.push_back(host.sample(std::span<const float>(logits).subspan(size_t(r * vocab), size_t(vocab)), picks[size_t(r)]));
  }

  // The device.
  engine::PickDraws pick_draws;
  std::vector<cuda::SampleParams> params;
  std::vector<double> u;
  for (const TokenPick& p : picks) {
    pick_draws.add(p);
    params.push_back(pick_draws.draws().back().params);
    u.push_back(p.u);
  }
  const std::span<const engine::TokenDraw> draws = pick_draws.draws();
  Guarded<float> dl(logits);
  Guarded<uint8_t> pick_ws(engine::pick_workspace_nbytes(rows, vocab));
  auto sample_nbytes = cuda::sample_workspace_nbytes(rows, vocab);
  ASSERT_TRUE(sample_nbytes.ok());
  Guarded<uint8_t> sample_ws(*sample_nbytes);
  Guarded<cuda::SampleParams> dp(params);
  Guarded<double> du(u);
  Guarded<int32_t> next{size_t(rows)};
  engine::PickEdits edits(pick_ws.get(), pick_ws.size());
  SPW_ASSERT_OK(edits.before_draw(dl.get(), vocab, draws, nullptr));
  SPW_ASSERT_OK(cuda::sample(dl.get(), rows, vocab, dp.get(), du.get(), sample_ws.get(), sample_ws.size(), next.get(), nullptr));
  std::vector<cuda::RowLogprobs> lp;
  SPW_ASSERT_OK(edits.after_draw(dl.get(), next.get(), lp, nullptr));
  const std::vector<int32_t> got = next.download();
  ASSERT_EQ(lp.size(), size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const TokenPick& p = picks[size_t(r)];
    const runtime::GeneratedToken& w = want[size_t(r)];
    SCOPED_TRACE(testing::Message() << "row " << r << " T=" << p.temperature << " top_logprobs=" << p.top_logprobs
                                    << " masked=" << !p.allowed.empty() << " shifts=" << engine::pick_shifts(p));
    EXPECT_EQ(got[size_t(r)], w.id);
    if (p.top_logprobs < 0) continue;
    EXPECT_TRUE(close(lp[size_t(r)].chosen, w.logprob)) << lp[size_t(r)].chosen << " vs " << w.logprob;
    ASSERT_EQ(size_t(lp[size_t(r)].n_top), w.top.size());
    for (size_t j = 0; j < w.top.size(); ++j) {
      EXPECT_EQ(lp[size_t(r)].top_ids[j], w.top[j].id) << "top " << j;
      EXPECT_TRUE(close(lp[size_t(r)].top_logprobs[j], w.top[j].logprob)) << "top " << j;
    }
  }
  EXPECT_TRUE(pick_ws.guards_intact()) << "pick workspace overrun";
}

TEST(CudaOpsPick, MatchesTheServerSamplerRealVocabulary) {
  SPW_REQUIRE_GPU();
  pick_case(1, 129280, 1);
  pick_case(12, 129280, 2);
  pick_case(64, 129280, 3);
}

TEST(CudaOpsPick, MatchesTheServerSamplerSmallVocabularies) {
  SPW_REQUIRE_GPU();
  for (int64_t vocab : {7, 1023})
    for (int64_t rows : {1, 13}) pick_case(rows, vocab, uint32_t(vocab + rows));
}

TEST(CudaOpsPick, RefusesWhatTheWorkspaceCannotHold) {
  SPW_REQUIRE_GPU();
  const int64_t vocab = 1000;
  Guarded<float> dl(std::vector<float>(size_t(2 * vocab), 0.f));
  Guarded<uint8_t> ws(engine::pick_workspace_nbytes(1, vocab));
  engine::PickEdits edits(ws.get(), ws.size());
  engine::TokenDraw d;
  d.top_logprobs = 0;
  std::vector<engine::TokenDraw> two(2, d);
  EXPECT_FALSE(edits.before_draw(dl.get(), vocab, two, nullptr).ok()) << "two rows in a one-row workspace";
  std::vector<cuda::LogitShift> many(size_t(engine::kPickShiftsPerStep) + 1, cuda::LogitShift{0, 1.f});
  d.penalties = many;
  EXPECT_FALSE(engine::fits_pick_workspace(std::span<const engine::TokenDraw>(&d, 1)));
  EXPECT_FALSE(edits.before_draw(dl.get(), vocab, std::span<const engine::TokenDraw>(&d, 1), nullptr).ok());
  d.penalties = {};
  d.top_logprobs = cuda::kMaxTopLogprobs + 1;
  EXPECT_FALSE(edits.before_draw(dl.get(), vocab, std::span<const engine::TokenDraw>(&d, 1), nullptr).ok());
  d.top_logprobs = -1;
  const std::vector<uint64_t> short_mask(3, ~uint64_t(0));
  d.allowed = short_mask;
  EXPECT_FALSE(edits.before_draw(dl.get(), vocab, std::span<const engine::TokenDraw>(&d, 1), nullptr).ok())
      << "a mask of 3 words for 1000 tokens";
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
