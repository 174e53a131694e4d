// Model::truncate on the tiny fixture checkpoints: a forward of drafted tokens taken back to any
// position leaves exactly the state that forwarding only the kept tokens leaves (every ring row,
// compressor group, compressed entry, index key, the Engram history and V4.1's published index
// layer), and decoding on from it gives the same logits, bit for bit. The spans cross the window
// ring's wrap, ratio-2/4 groups and a ratio-128 group boundary (position 255).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "model_fixture.h"

namespace spw {
namespace {

using test::random_tokens;

std::unique_ptr<Model> fixture(const std::string& arch) { return test::load_fixture(arch, Numerics::exact()); }

void expect_same_compressor(const CompressorState& a, const CompressorState& b, const std::string& where) {
  EXPECT_EQ(a.kv, b.kv) << where << " kv";
  EXPECT_EQ(a.score, b.score) << where << " score";
  EXPECT_EQ(a.prev_kv, b.prev_kv) << where << " prev_kv";
  EXPECT_EQ(a.prev_score, b.prev_score) << where << " prev_score";
  EXPECT_EQ(a.has_prev, b.has_prev) << where << " has_prev";
}

void expect_same_state(const SequenceState& a, const SequenceState& b, const std::string& label) {
  ASSERT_EQ(a.n_past, b.n_past) << label;
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const std::string where = label + " layer " + std::to_string(l);
    EXPECT_EQ(a.layers[l].window, b.layers[l].window) << where << " window ring";
    EXPECT_EQ(a.layers[l].compressed, b.layers[l].compressed) << where << " compressed";
    EXPECT_EQ(a.layers[l].index_keys, b.layers[l].index_keys) << where << " index keys";
    expect_same_compressor(a.layers[l].comp, b.layers[l].comp, where + " compressor");
    expect_same_compressor(a.layers[l].idx_comp, b.layers[l].idx_comp, where + " indexer compressor");
  }
  EXPECT_EQ(a.engram_recent, b.engram_recent) << label;
  EXPECT_EQ(a.published_index_k_layer, b.published_index_k_layer) << label;
}

std::vector<float> forward_ok(const Model& m, SequenceState& seq, std::span<const int32_t> tokens) {
  auto r = m.forward(seq, tokens);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::move(r.value()) : std::vector<float>{};
}

// A prompt of n_prompt tokens, then a forward of n_draft tokens kept for rollback and taken back to each
// kept count in turn (longest first, so later truncations go back over earlier ones), each compared with
// the state of a sequence that was only given the kept tokens, and continued for a few decode steps.
// one_token_kept: whether keeping exactly one token is compared (V4.1's stale-index quirk computes a lone
// token as a decode step, which the longer forward did not).
void check_truncate(const Model& m, size_t n_prompt, size_t n_draft, bool one_token_kept, const std::string& label) {
  const int64_t vocab = m.config().vocab_size;
  const auto prompt = random_tokens(n_prompt, vocab, 11);
  const auto draft = random_tokens(n_draft, vocab, 12);
  const auto after = random_tokens(3, vocab, 13);

  SequenceState base = m.new_sequence();
  forward_ok(m, base, prompt);
  SequenceState spec = base;
  spec.keep_rollback = true;
  forward_ok(m, spec, draft);
  spec.keep_rollback = false;
  for (size_t kept = n_draft + 1; kept-- > 0;) {
    const std::string where = label + " keeping " + std::to_string(kept) + " of " + std::to_string(n_draft);
    if (kept == 1 && !one_token_kept) {
      // The rows differ (decode step vs. longer forward), but not what is published or remembered.
      SequenceState taken = spec, plain = base;
      ASSERT_TRUE(m.truncate(taken, int64_t(n_prompt + 1)).ok()) << where;
      forward_ok(m, plain, std::span<const int32_t>(draft).first(1));
      EXPECT_EQ(taken.published_index_k_layer, plain.published_index_k_layer) << where;
      EXPECT_EQ(taken.engram_recent, plain.engram_recent) << where;
      continue;
    }
    SequenceState taken = spec;
    ASSERT_TRUE(m.truncate(taken, int64_t(n_prompt + kept)).ok()) << where;
    SequenceState plain = base;
    if (kept > 0) forward_ok(m, plain, std::span<const int32_t>(draft).first(kept));
    expect_same_state(taken, plain, where);
    const SequenceState plain_at_kept = plain;
    for (int32_t t : after) {
      const auto a = forward_ok(m, taken, std::span<const int32_t>(&t, 1));
      const auto b = forward_ok(m, plain, std::span<const int32_t>(&t, 1));
      ASSERT_EQ(a, b) << where << ": decoding on differs";
    }
    // The log stays: the original, truncated step by step further back, passes through the same states.
    ASSERT_TRUE(m.truncate(spec, int64_t(n_prompt + kept)).ok()) << where;
    expect_same_state(spec, plain_at_kept, where + " (stepwise)");
  }
}

TEST(ModelRollback, V4TruncateEqualsForwardingTheKeptTokens) {
  auto m = fixture("v4");
  ASSERT_TRUE(m);
  check_truncate(*m, 150, 9, true, "v4 window wrap");
  check_truncate(*m, 250, 9, true, "v4 across the ratio-128 group at 255");
  m->set_numerics(Numerics::reference());
  check_truncate(*m, 250, 9, true, "v4 reference numerics");
}

TEST(ModelRollback, V41TruncateEqualsForwardingTheKeptTokens) {
  auto m = fixture("v41");
  ASSERT_TRUE(m);
  Numerics n = Numerics::exact();
  n.stale_index_k = false;
  m->set_numerics(n);
  check_truncate(*m, 150, 9, true, "v41 window wrap");
  check_truncate(*m, 251, 8, true, "v41 odd start");
  n = Numerics::reference();
  m->set_numerics(n);
  check_truncate(*m, 250, 9, false, "v41 reference numerics with the stale-index quirk");
}

TEST(ModelRollback, RefusesWhatTheLogCannotTakeBack) {
  auto m = fixture("v4");
  ASSERT_TRUE(m);
  const auto tokens = random_tokens(20, m->config().vocab_size, 5);
  SequenceState seq = m->new_sequence();
  forward_ok(*m, seq, std::span<const int32_t>(tokens).first(10));
  EXPECT_FALSE(m->truncate(seq, 9).ok()) << "no forward kept a log";
  seq.keep_rollback = true;
  forward_ok(*m, seq, std::span<const int32_t>(tokens).subspan(10, 5));
  EXPECT_FALSE(m->truncate(seq, 9).ok()) << "before the logged forward's start";
  EXPECT_FALSE(m->truncate(seq, 16).ok()) << "past the sequence's end";
  EXPECT_TRUE(m->truncate(seq, 12).ok());
  seq.keep_rollback = false;
  forward_ok(*m, seq, std::span<const int32_t>(tokens).subspan(12, 2));
  EXPECT_FALSE(m->truncate(seq, 13).ok()) << "a forward without the log drops it";

  // A logged forward is bounded by the window; the refusal leaves the sequence as it was.
  seq.keep_rollback = true;
  const auto long_draft = random_tokens(size_t(m->config().window) + 1, m->config().vocab_size, 6);
  const int64_t before = seq.n_past;
  auto r = m->forward(seq, long_draft);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("window"), std::string::npos) << r.error().message;
  EXPECT_EQ(seq.n_past, before);
}

}  // namespace
}  // namespace spw
