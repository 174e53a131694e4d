// The Anthropic Messages layer without a model: the request rewrite into the chat machinery's
// inputs (src/server/anthropic_request.h), random mutations of a valid body (never a throw; every
// rejection a 400 with a message naming the field), content blocks and SSE events built from
// stream-parser deltas (src/server/anthropic_response.h), the error shapes, and which stop
// sequence StopMatcher reports. End to end through the SDK: tests/python/server/test_anthropic.py.
#include <gtest/gtest.h>

#include <random>

#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/generation.h"

namespace spw::server {
namespace {

Json full_body() {
  return Json::parse(R"({
    "model": "m", "max_tokens": 64, "temperature": 0.5, "top_p": 0.9, "top_k": 7,
    "stop_sequences": ["END", ""], "stream": true, "metadata": {"user_id": "u"},
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Need a tool.", "signature": "sig"},
        {"type": "redacted_thinking", "data": "xx"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "21C"}]},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "clock broke", "is_error": true},
        {"type": "text", "text": "And tomorrow?"}]}],
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
              {"name": "get_time", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
    "thinking": {"type": "enabled", "budget_tokens": 2048}})");
}

TEST(AnthropicRequest, RewritesIntoTheChatShape) {
  auto r = parse_messages_request(full_body());
  ASSERT_TRUE(r.ok) << r.error.message;
  const ChatCompletionRequest& c = r.value.chat;
  EXPECT_EQ(c.model, "m");
  EXPECT_EQ(c.gen.max_tokens, 64);
  EXPECT_FLOAT_EQ(c.gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(c.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(c.gen.sampling.top_k, 7);
  EXPECT_EQ(c.gen.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(c.gen.stream);
  EXPECT_EQ(c.tool_choice, "function:get_weather");
  EXPECT_FALSE(c.parallel_tool_calls);

  const Json expected = Json::parse(R"({
    "messages": [
      {"role": "system", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "Checking.", "reasoning_content": "Need a tool.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "toolu_2", "type": "function", "function": {"name": "get_time", "arguments": {}}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny\n\n21C"},
      {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: clock broke"},
      {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}],
    "tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}],
    "thinking": true})");
  EXPECT_EQ(r.value.chat_body, expected) << r.value.chat_body.dump(1);
}

TEST(AnthropicRequest, ToolChoiceAndThinkingModes) {
  Json b = full_body();
  b["tool_choice"] = Json{{"type", "any"}};
  auto r = parse_messages_request(b);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.value.chat.tool_choice, "required");
  EXPECT_TRUE(r.value.chat.parallel_tool_calls);
  b["tool_choice"] = Json{{"type", "none"}};
  b["thinking"] = Json{{"type", "disabled"}};
  r = parse_messages_request(b);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.value.chat.tool_choice, "none");
  EXPECT_EQ(r.value.chat_body["thinking"], false);
  b.erase("thinking");
  b.erase("tool_choice");
  r = parse_messages_request(b);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.value.chat.tool_choice, "auto");
  EXPECT_FALSE(r.value.chat_body.contains("thinking"));  // the chat encoder's default (chat mode)
}

// Each edit of the valid body must be rejected with a 400 whose message names `path`.
TEST(AnthropicRequest, ErrorsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"max_tokens": null})", "max_tokens"},
      {R"({"max_tokens": 0})", "max_tokens"},
      {R"({"model": 5})", "model"},
      {R"({"temperature": 1.5})", "temperature"},
      {R"({"top_p": 0})", "top_p"},
      {R"({"stop_sequences": "END"})", "stop_sequences"},
      {R"({"system": [{"type": "image"}]})", "system.0.type"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "system", "content": "x"}]})", "messages.0.role"},
      {R"({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]})", "messages.0.content.0.type"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})", "messages.0.content.0.source.type"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]})",
       "messages.0.content.0.source.type"},
      {R"({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})", "messages.0.content.0.tool_use_id"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "pre"}]})", "messages.1"},
      {R"({"tools": [{"name": "f"}]})", "tools.0.input_schema"},
      {R"({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})", "tools.0.type"},
      {R"({"tool_choice": {"type": "tool", "name": "nope"}})", "tool_choice.name"},
      {R"({"tool_choice": {"type": "required"}})", "tool_choice.type"},
      {R"({"thinking": {"type": "enabled", "budget_tokens": null}})", "thinking.budget_tokens"},
  };
  for (const auto& [patch, path] : cases) {
    Json b = full_body();
    b.merge_patch(Json::parse(patch));
    auto r = parse_messages_request(b);
    ASSERT_FALSE(r.ok) << patch;
    EXPECT_EQ(r.error.status, 400);
    EXPECT_EQ(r.error.message.rfind(path + ":", 0), 0u) << patch << " → " << r.error.message;
  }
}

TEST(AnthropicRequest, RandomMutationsNeverThrow) {
  std::mt19937 g(11);
  const std::vector<std::string> fields = {"model", "max_tokens", "messages", "system", "tools", "tool_choice",
                                           "thinking", "stop_sequences", "temperature", "top_p", "top_k", "stream"};
  const std::vector<Json> values = {nullptr, true, -1, 0, 3.5, "x", Json::array(), Json::object(),
                                    Json::array({1, "a", nullptr}), Json{{"type", "text"}}, Json{{"type", 7}},
                                    Json::array({Json{{"role", "user"}, {"content", Json::array({Json{{"type", "tool_result"}}})}}})};
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    Json b = full_body();
    for (unsigned i = 0, n = 1 + g() % 3; i < n; ++i) {
      const std::string& f = fields[g() % fields.size()];
      if (g() % 4 == 0) b.erase(f);
      else if (g() % 2 && b[f].is_array() && !b[f].empty()) b[f][g() % b[f].size()] = values[g() % values.size()];
      else b[f] = values[g() % values.size()];
    }
    ASSERT_NO_THROW({
      auto r = parse_messages_request(b);
      if (r.ok) {
        ++ok;
        EXPECT_GE(*r.value.chat.gen.max_tokens, 1);
        EXPECT_TRUE(r.value.chat_body["messages"].is_array());
      } else {
        ++rejected;
        EXPECT_EQ(r.error.status, 400);
        EXPECT_FALSE(r.error.message.empty());
      }
    }) << b.dump();
  }
  EXPECT_GT(ok, 100);
  EXPECT_GT(rejected, 1000);
}

TEST(AnthropicResponse, BlocksAndEventsFromDeltas) {
  std::vector<Json> events;
  ContentBlocks blocks([&](const char* name, const Json& data) {
    EXPECT_EQ(data["type"], name);
    events.push_back(data);
    return true;
  });
  StreamDelta d1;
  d1.reasoning_content = "hmm";
  blocks.push(d1);
  StreamDelta d2;
  d2.reasoning_content = " ok";
  d2.content = "Hi";
  d2.tool_calls.push_back({0, "toolu_x_0", "get_weather", R"({"city": "Paris"})"});
  d2.tool_calls.push_back({1, "toolu_x_1", "broken", "{not json"});
  blocks.push(d2);
  blocks.close();
  EXPECT_TRUE(blocks.ok());
  EXPECT_TRUE(blocks.any_tool_use());
  const Json expected = Json::parse(R"([
    {"type": "thinking", "thinking": "hmm ok", "signature": ""},
    {"type": "text", "text": "Hi"},
    {"type": "tool_use", "id": "toolu_x_0", "name": "get_weather", "input": {"city": "Paris"}},
    {"type": "text", "text": "broken{not json"}])");
  EXPECT_EQ(blocks.content(), expected) << blocks.content().dump();
  std::vector<std::string> kinds;
  for (const auto& e : events) {
    std::string k = e["type"];
    if (e.contains("delta")) k += ":" + e["delta"]["type"].get<std::string>();
    if (e.contains("content_block")) k += ":" + e["content_block"]["type"].get<std::string>();
    kinds.push_back(k + "@" + std::to_string(e["index"].get<int>()));
  }
  const std::vector<std::string> expected_kinds = {
      "content_block_start:thinking@0", "content_block_delta:thinking_delta@0", "content_block_delta:thinking_delta@0",
      "content_block_delta:signature_delta@0", "content_block_stop@0", "content_block_start:text@1",
      "content_block_delta:text_delta@1", "content_block_stop@1", "content_block_start:tool_use@2",
      "content_block_delta:input_json_delta@2", "content_block_stop@2", "content_block_start:text@3",
      "content_block_delta:text_delta@3", "content_block_stop@3"};
  EXPECT_EQ(kinds, expected_kinds);
  EXPECT_EQ(events[9]["delta"]["partial_json"], R"({"city":"Paris"})");
  EXPECT_EQ(events[8]["content_block"]["input"], Json::object());
}

TEST(AnthropicResponse, EmitterFailureStopsEvents) {
  int n = 0;
  ContentBlocks blocks([&](const char*, const Json&) { return ++n < 2; });
  StreamDelta d;
  d.content = "a";
  blocks.push(d);
  blocks.push(d);
  blocks.close();
  EXPECT_FALSE(blocks.ok());
  EXPECT_EQ(n, 2);
}

TEST(AnthropicResponse, ErrorShapes) {
  const Json e = anthropic_error_json(bad_request("max_tokens: Field required", "max_tokens"));
  EXPECT_EQ(e, Json::parse(R"({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}})"));
  const ApiError busy{503, "queue full", "server_overloaded", "", "queue_full"};
  EXPECT_EQ(anthropic_error_status(busy), 529);
  EXPECT_EQ(anthropic_error_json(busy)["error"]["type"], "overloaded_error");
  EXPECT_EQ(anthropic_error_json({401, "no", "", "", ""})["error"]["type"], "authentication_error");
  EXPECT_EQ(anthropic_error_json({500, "boom", "", "", ""})["error"]["type"], "api_error");
  EXPECT_EQ(anthropic_sse("ping", Json{{"type", "ping"}}), "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

TEST(ServerStopMatcher, ReportsTheLeftmostStopSequence) {
  StopMatcher m({"zz", "b c", "c"});
  EXPECT_EQ(m.push("a b"), "a ");  // "b" could still become "b c"
  EXPECT_EQ(m.matched(), "");
  EXPECT_EQ(m.push(" c d"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "b c");  // leftmost wins over "c", which also occurs
  StopMatcher none({"x"});
  EXPECT_EQ(none.push("abc") + none.flush(), "abc");
  EXPECT_EQ(none.matched(), "");
}

}  // namespace
}  // namespace spw::server
