// ToolCallConstraint + TokenTrie + Sampler: with random logits, greedy and sampled decoding over a
// toy vocabulary (all single bytes plus multi-byte tokens that cross tag boundaries) only ever
// produce a complete DSML block followed by EOS; the mask matches a brute-force check of every
// token; logprobs come from the masked distribution.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "chat/stream_parser.h"
#include "runtime/sampler.h"
#include "server/grammar_constraint.h"

namespace spw::server {
namespace {

using ojson = nlohmann::ordered_json;

// The constraint's mask applied to logits, as the host sampler applies it.
void mask(runtime::LogitsConstraint& c, std::span<float> logits) {
  std::vector<uint64_t> bits((logits.size() + 63) / 64, 0);
  c.allowed(bits);
  runtime::apply_mask(logits, bits);
}

constexpr int32_t kEos = 1;

std::vector<std::string> toy_vocab() {
  std::vector<std::string> v = {"", "<｜end▁of▁sentence｜>"};  // 0: no token, 1: EOS
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, char(b)));
  for (const char* t : {"\n\n", "<｜DSML｜ calls>", "｜DSML｜", " calls>\n", "<｜DSML｜ invoke name=\"", "get_", "weather",
                        "time\">", "\">\n", "<｜DSML｜ parameter name=\"", "city\" string=\"true\">", "Paris",
                        "Berlin</", "</｜DSML｜ parameter>", "</｜DSML｜ invoke>\n</｜DSML｜ calls>", "\"", "\" string=\"",
                        "true", "false", "<think>", "hello world", "\n", "</"})
    v.push_back(t);
  return v;
}

ToolCallGrammar grammar() {
  std::vector<ToolSpec> tools = {
      make_tool("get_weather", "", ojson::parse(R"({"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin"]}, "days": {"type": "integer"}},
        "required": ["city"]})")),
      make_tool("get_time", "", ojson::parse(R"({"type": "object", "properties": {}})")),
  };
  return ToolCallGrammar::build(tools, {}).value();
}

struct Decoded {
  std::string text;
  bool ended = false;  // EOS sampled
};

Decoded decode(const runtime::SamplingParams& params, uint64_t logits_seed, int max_steps = 3000) {
  auto g = std::make_shared<const ToolCallGrammar>(grammar());
  auto trie = std::make_shared<const TokenTrie>(toy_vocab());
  auto constraint = std::make_shared<ToolCallConstraint>(g, trie, kEos);
  runtime::Sampler sampler(params, constraint);
  std::mt19937_64 rng(logits_seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  const size_t n_logits = trie->n_tokens() + 5;  // the model's vocabulary may pass the tokenizer's
  Decoded out;
  for (int step = 0; step < max_steps; ++step) {
    std::vector<float> logits(n_logits);
    for (float& l : logits) l = normal(rng);
    logits[kEos] += 2.f;  // an eager EOS must still wait for the block to close
    const runtime::GeneratedToken tok = sampler.sample(logits);
    EXPECT_TRUE(std::isfinite(tok.logprob));
    EXPECT_LE(tok.logprob, 0.f);
    for (const auto& alt : tok.top) EXPECT_TRUE(std::isfinite(alt.logprob));
    if (tok.id == kEos) {
      out.ended = true;
      return out;
    }
    EXPECT_LT(size_t(tok.id), trie->n_tokens());
    out.text += trie->bytes(tok.id);
  }
  return out;
}

void expect_valid_block(const Decoded& d) {
  ASSERT_TRUE(d.ended) << d.text;
  const ToolCallGrammar g = grammar();
  auto s = g.start();
  ASSERT_TRUE(g.feed(s, d.text) && g.accepting(s)) << d.text;
  const ParsedCompletion parsed = parse_completion(d.text, {});
  ASSERT_FALSE(parsed.tool_calls.empty()) << d.text;
  EXPECT_TRUE(parsed.content.empty()) << d.text;
  for (const ToolCall& c : parsed.tool_calls) {
    const ojson args = ojson::parse(c.arguments);
    if (c.name == "get_weather") {
      EXPECT_TRUE(args.contains("city")) << c.arguments;
    }
  }
}

TEST(ToolCallConstraint, GreedyAndSampledDecodingGiveValidBlocks) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    runtime::SamplingParams greedy;
    greedy.temperature = 0;
    expect_valid_block(decode(greedy, seed));
    runtime::SamplingParams sampled;
    sampled.temperature = 1.f;
    sampled.top_p = 0.9f;
    sampled.top_k = 50;
    sampled.seed = seed;
    sampled.top_logprobs = 3;
    expect_valid_block(decode(sampled, seed + 1000));
  }
}

TEST(ToolCallConstraint, MaskMatchesBruteForce) {
  const auto vocab = toy_vocab();
  auto g = std::make_shared<const ToolCallGrammar>(grammar());
  auto trie = std::make_shared<const TokenTrie>(vocab);
  ToolCallConstraint c(g, trie, kEos);
  // Walk a fixed block token by token; at every step compare the mask with a per-token check.
  const std::vector<std::string> script = {"\n\n", "<｜DSML｜ calls>", "\n", "<｜DSML｜ invoke name=\"", "get_", "weather",
                                           "\">\n", "<｜DSML｜ parameter name=\"", "city\" string=\"true\">", "Paris",
                                           "</｜DSML｜ parameter>", "</｜DSML｜ invoke>\n</｜DSML｜ calls>"};
  auto state = g->start();
  for (const std::string& piece : script) {
    std::vector<float> logits(vocab.size(), 0.f);
    mask(c, logits);
    for (size_t id = 0; id < vocab.size(); ++id) {
      auto t = state;
      const bool expect = id != size_t(kEos) && !vocab[id].empty() && g->feed(t, vocab[id]);
      EXPECT_EQ(std::isfinite(logits[id]), expect) << "token " << ::testing::PrintToString(vocab[id]);
    }
    const auto id = int32_t(std::find(vocab.begin(), vocab.end(), piece) - vocab.begin());
    ASSERT_TRUE(std::isfinite(logits[size_t(id)])) << piece;
    c.accept(id);
    ASSERT_TRUE(g->feed(state, piece));
  }
  // Complete: only EOS is left, with probability 1.
  std::vector<float> logits(vocab.size(), 5.f);
  mask(c, logits);
  for (size_t id = 0; id < vocab.size(); ++id) EXPECT_EQ(std::isfinite(logits[id]), id == size_t(kEos));
}

TEST(ToolCallConstraint, LogprobsComeFromTheMaskedDistribution) {
  auto g = std::make_shared<const ToolCallGrammar>(grammar());
  auto trie = std::make_shared<const TokenTrie>(toy_vocab());
  runtime::SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 5;
  runtime::Sampler sampler(p, std::make_shared<ToolCallConstraint>(g, trie, kEos));
  std::vector<float> logits(trie->n_tokens(), 0.f);
  logits[size_t(kEos)] = 50.f;  // the raw favourite is not allowed yet
  const runtime::GeneratedToken tok = sampler.sample(logits);
  // Allowed first tokens: "\n" (twice: the byte and a second id with the same bytes), "\n\n", "<"
  // and "<｜DSML｜ calls>": equal logits, so each has 1/5.
  EXPECT_NEAR(tok.logprob, std::log(0.2f), 1e-5);
  ASSERT_EQ(tok.top.size(), 5u);
  for (const auto& alt : tok.top) {
    const std::string_view b = trie->bytes(alt.id);
    EXPECT_TRUE(b == "\n" || b == "\n\n" || b == "<" || b == "<｜DSML｜ calls>") << b;
  }
}

}  // namespace
}  // namespace spw::server
