// Property test of OpenAI request parsing (src/server/openai_request.h): thousands of random
// mutations of valid completion and chat bodies (type swaps, out-of-range numbers, deleted and
// duplicated fields, deep nesting, odd strings) must never throw or crash; every result is either
// a typed request whose values respect the documented ranges, or a 400 ApiError with a message.
// Also: the text stop matcher against a brute-force reference on random strings.
#include <gtest/gtest.h>

#include <random>

#include "server/generation.h"
#include "server/openai_request.h"

namespace spw::server {
namespace {

Json random_scalar(std::mt19937& g) {
  switch (g() % 10) {
    case 0: return nullptr;
    case 1: return bool(g() % 2);
    case 2: return int64_t(g()) - int64_t(1u << 31);
    case 3: return double(int32_t(g())) / 997.0;
    case 4: return std::numeric_limits<int64_t>::min();
    case 5: return std::numeric_limits<uint64_t>::max();
    case 6: return std::string(g() % 5, char('a' + g() % 26));
    case 7: return std::string("\xff\xfe\x00x", 4);
    case 8: return 1e308 * 10;  // inf
    default: return -0.0;
  }
}

Json random_value(std::mt19937& g, int depth) {
  if (depth > 3 || g() % 3) return random_scalar(g);
  if (g() % 2) {
    Json a = Json::array();
    for (unsigned i = 0, n = g() % 4; i < n; ++i) a.push_back(random_value(g, depth + 1));
    return a;
  }
  Json o = Json::object();
  for (unsigned i = 0, n = g() % 4; i < n; ++i) o["k" + std::to_string(g() % 5)] = random_value(g, depth + 1);
  return o;
}

const std::vector<std::string> kFields = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                                          "temperature", "top_p", "top_k", "min_p", "seed", "n", "stop",
                                          "stop_token_ids", "stream", "stream_options", "logprobs", "top_logprobs",
                                          "presence_penalty", "frequency_penalty", "echo", "suffix", "ignore_eos",
                                          "tool_choice", "response_format", "tools"};

Json base_completion() {
  return Json::parse(R"({"model":"m","prompt":"hello","max_tokens":8,"temperature":0.7,"top_p":0.9,"top_k":5,
    "seed":3,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},"logprobs":2})");
}

Json base_chat() {
  return Json::parse(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":8,
    "logprobs":true,"top_logprobs":2,"tool_choice":{"type":"function","function":{"name":"f"}},"min_p":0.1})");
}

Json mutate(Json body, std::mt19937& g) {
  for (unsigned i = 0, n = 1 + g() % 4; i < n; ++i) {
    const std::string& f = kFields[g() % kFields.size()];
    switch (g() % 4) {
      case 0: body.erase(f); break;
      case 1: body[f] = random_scalar(g); break;
      case 2: body[f] = random_value(g, 0); break;
      default:
        if (body.contains(f) && body[f].is_array() && !body[f].empty()) body[f][g() % body[f].size()] = random_value(g, 1);
        else body[f] = Json::array({random_scalar(g), random_scalar(g)});
    }
  }
  if (g() % 20 == 0) return random_value(g, 0);  // not even an object
  return body;
}

void check_generation(const GenerationParams& gen) {
  const auto& s = gen.sampling;
  EXPECT_TRUE(s.temperature >= 0 && s.temperature <= 2);
  EXPECT_TRUE(s.top_p > 0 && s.top_p <= 1);
  EXPECT_GE(s.top_k, 0);
  EXPECT_TRUE(s.min_p >= 0 && s.min_p <= 1);
  EXPECT_TRUE(s.top_logprobs >= -1 && s.top_logprobs <= 20);
  if (gen.max_tokens) { EXPECT_GE(*gen.max_tokens, 1); }
  for (const auto& st : gen.stop) EXPECT_FALSE(st.empty());
  for (int32_t id : gen.stop_token_ids) EXPECT_GE(id, 0);
}

void check_error(const ApiError& e) {
  EXPECT_EQ(e.status, 400);
  EXPECT_FALSE(e.message.empty());
  EXPECT_EQ(e.type, "invalid_request_error");
  const Json j = error_json(e);
  EXPECT_TRUE(j["error"].contains("param") && j["error"].contains("code"));
}

TEST(ServerRequestFuzz, RandomMutationsNeverThrowAndStayValid) {
  std::mt19937 g(20240601);
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const bool chat = iter % 2;
    const Json body = mutate(chat ? base_chat() : base_completion(), g);
    ASSERT_NO_THROW({
      if (chat) {
        auto r = parse_chat_completion_request(body);
        if (r.ok) {
          ++ok;
          check_generation(r.value.gen);
        } else {
          ++rejected;
          check_error(r.error);
        }
      } else {
        auto r = parse_completion_request(body);
        if (r.ok) {
          ++ok;
          check_generation(r.value.gen);
          EXPECT_FALSE(r.value.prompts.empty());
          for (const auto& p : r.value.prompts)
            if (auto* ids = std::get_if<std::vector<int32_t>>(&p)) { EXPECT_FALSE(ids->empty()); }
        } else {
          ++rejected;
          check_error(r.error);
        }
      }
      (void)parse_tokenize_request(body);
      (void)parse_detokenize_request(body);
    }) << body.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  std::printf("[ measured ] 20000 mutated bodies: %d accepted, %d rejected with 400\n", ok, rejected);
  EXPECT_GT(ok, 1000);
  EXPECT_GT(rejected, 1000);
}

TEST(ServerRequestFuzz, ErrorsNameTheField) {
  auto r = parse_completion_request(Json::parse(R"({"prompt":"x","temperature":"hot"})"));
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.error.param, "temperature");
  EXPECT_NE(r.error.message.find("temperature"), std::string::npos);
  r = parse_completion_request(Json::parse(R"({"prompt":[1,2,-3]})"));
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.error.param, "prompt");
  r = parse_completion_request(Json::parse(R"({"prompt":"x","logit_bias":{"5":101}})"));
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.error.param, "logit_bias");
  r = parse_completion_request(Json::parse(R"({"prompt":"x","logit_bias":{"five":1}})"));
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.error.param, "logit_bias");
  r = parse_completion_request(Json::parse(R"({"prompt":["a",[1,2]]})"));
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.error.param, "prompt");
  r = parse_completion_request(Json::parse(R"({"prompt":[[1,2],[3]],"n":2,"logit_bias":{"7":-100,"8":2.5}})"));
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.value.prompts.size(), 2u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.value.prompts[1]), std::vector<int32_t>{3});
  EXPECT_EQ(r.value.gen.sampling.logit_bias.size(), 2u);
  auto c = parse_chat_completion_request(Json::parse(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":7,"unknown":{"deep":[1]}})"));
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.value.gen.max_tokens, 7);
}

// Semantics: after each piece of text (one token's), if a stop string is present the output is
// cut at its leftmost occurrence; a longer stop that started earlier but would complete in a later
// piece does not win (vLLM behaves the same way).
TEST(ServerStopMatcher, MatchesBruteForceOnRandomSplits) {
  std::mt19937 g(7);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string full;
    for (unsigned i = 0, n = g() % 40; i < n; ++i) full += char('a' + g() % 3);
    std::vector<std::string> stops;
    for (unsigned i = 0, n = g() % 3; i < n; ++i) {
      std::string s;
      for (unsigned k = 0, m = 1 + g() % 4; k < m; ++k) s += char('a' + g() % 3);
      stops.push_back(s);
    }
    // Pieces of 1-5 bytes, as tokens would bring them.
    std::vector<size_t> ends;
    for (size_t pos = 0; pos < full.size();) ends.push_back(pos += std::min<size_t>(full.size() - pos, 1 + g() % 5));
    // Reference: after the first piece whose arrival makes some stop string present, the output
    // is cut at the leftmost occurrence.
    size_t cut = std::string::npos;
    for (size_t k = 0; k < ends.size() && cut == std::string::npos; ++k)
      for (const auto& s : stops) cut = std::min(cut, full.substr(0, ends[k]).find(s));
    const std::string expected = full.substr(0, cut);
    StopMatcher m(stops);
    std::string got;
    size_t begin = 0;
    for (size_t k = 0; k < ends.size() && !m.stopped(); begin = ends[k++])
      got += m.push(std::string_view(full).substr(begin, ends[k] - begin));
    got += m.flush();
    EXPECT_EQ(got, expected) << full;
    EXPECT_EQ(m.stopped(), cut != std::string::npos);
  }
}

}  // namespace
}  // namespace spw::server
