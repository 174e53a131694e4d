// Bounded JSON parsing (src/chat/json_limits.h, src/server/request_body.h) and the walks over client
// JSON that used to recurse once per nesting level: nlohmann's copy (tools into ToolSpec) and the
// Python-style dump (tool schemas, tool-call arguments). Each deep case here overflowed the stack
// (SIGSEGV) before the limits; now it is an error that names the limit, or, for the dump, a result.
#include <gtest/gtest.h>

#include <string>

#include "chat/chat_encoding.h"
#include "chat/json_limits.h"
#include "chat/py_json.h"
#include "server/request_body.h"

namespace spw {
namespace {

using ojson = nlohmann::ordered_json;

// Deep enough that any recursion per level overflows an 8 MB stack.
constexpr size_t kVeryDeep = 200'000;

std::string nested_arrays(size_t n) { return std::string(n, '[') + std::string(n, ']'); }
std::string nested_objects(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += "{\"a\":";
  return s + "1" + std::string(n, '}');
}

// nlohmann's parser and destructor are iterative, so a DOM of any depth can be built and freed here.
ojson unbounded_parse(const std::string& text) { return ojson::parse(text); }

TEST(ParseJsonBounded, AcceptsTheDepthLimitAndRejectsOneMore) {
  const size_t limit = JsonLimits{}.max_depth;
  EXPECT_EQ(limit, 64u);
  auto at = parse_json_bounded(nested_arrays(limit));
  ASSERT_TRUE(at.ok()) << at.error().message;
  EXPECT_FALSE(json_depth_exceeds(*at, limit));
  auto over = parse_json_bounded(nested_arrays(limit + 1));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().message, "nests arrays/objects more than 64 levels deep (this server's limit)");
  EXPECT_FALSE(parse_json_bounded(nested_objects(limit + 1)).ok());
  EXPECT_TRUE(parse_json_bounded(nested_objects(limit)).ok());
}

TEST(ParseJsonBounded, RejectsVeryDeepTextWithoutBuildingIt) {
  auto r = parse_json_bounded("{\"x\":" + nested_arrays(kVeryDeep) + ",\"y\":1}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("more than 64 levels deep"), std::string::npos);
}

TEST(ParseJsonBounded, CountsValuesKeysAndContainers) {
  JsonLimits limits;
  limits.max_values = 5;
  EXPECT_TRUE(parse_json_bounded(R"({"a":[1,2]})", limits).ok());  // object, key, array, 1, 2
  auto r = parse_json_bounded(R"({"a":[1,2,3]})", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "has more than 5 JSON values (this server's limit)");
  EXPECT_FALSE(parse_json_bounded(R"({"a":1,"b":2,"c":3})", limits).ok());
}

TEST(ParseJsonBounded, InvalidJsonSaysWhere) {
  auto r = parse_json_bounded("{\"a\": [1, 2");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind("is not valid JSON: ", 0), 0u) << r.error().message;
  EXPECT_NE(r.error().message.find("column"), std::string::npos) << r.error().message;
  EXPECT_FALSE(parse_json_bounded("").ok());
  EXPECT_FALSE(parse_json_bounded("[1] x").ok());
}

TEST(ParseJsonBounded, ReturnsTheSameValueAsNlohmann) {
  const std::string text = R"({"b":[1,-2,3.5,"x",null,true,{}],"a":{"c":18446744073709551615}})";
  auto r = parse_json_bounded(text);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, ojson::parse(text));
  EXPECT_EQ(r->begin().key(), "b");  // insertion order kept
}

TEST(JsonDepthExceeds, WalksAVeryDeepDomIteratively) {
  const ojson deep = unbounded_parse(nested_arrays(kVeryDeep));
  EXPECT_TRUE(json_depth_exceeds(deep, 64));
  EXPECT_FALSE(json_depth_exceeds(deep, kVeryDeep));
  EXPECT_TRUE(json_depth_exceeds(deep, kVeryDeep - 1));
  EXPECT_FALSE(json_depth_exceeds(ojson(3), 0));
  EXPECT_TRUE(json_depth_exceeds(ojson::array(), 0));
}

TEST(ServerParseBody, DeepBodyIsA400NamingTheLimit) {
  auto r = server::parse_body("{\"x\":" + nested_arrays(50'000) + ",\"y\":1}");
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.error.status, 400);
  EXPECT_EQ(r.error.message, "the request body nests arrays/objects more than 64 levels deep (this server's limit)");
  auto not_json = server::parse_body("{");
  ASSERT_FALSE(not_json.ok);
  EXPECT_EQ(not_json.error.message.rfind("the request body is not valid JSON: ", 0), 0u);
  auto not_object = server::parse_body("[1]");
  ASSERT_FALSE(not_object.ok);
  EXPECT_EQ(not_object.error.message, "the request body must be a JSON object");
  EXPECT_TRUE(server::parse_body(R"({"prompt":"hi"})").ok);
}

TEST(PyJsonDumps, DumpsAVeryDeepValue) {
  EXPECT_EQ(py_json_dumps(unbounded_parse(nested_arrays(kVeryDeep))), nested_arrays(kVeryDeep));
  std::string objects;
  for (size_t i = 0; i < kVeryDeep; ++i) objects += "{\"a\": ";
  objects += "1" + std::string(kVeryDeep, '}');
  EXPECT_EQ(py_json_dumps(unbounded_parse(nested_objects(kVeryDeep))), objects);
}

TEST(PyJsonDumps, SeparatorsAndOrderAsPython) {
  EXPECT_EQ(py_json_dumps(ojson::parse(R"({"b":[1,[],{}],"a":{"x":[2.5,null]},"c":"é"})")),
            R"({"b": [1, [], {}], "a": {"x": [2.5, null]}, "c": "é"})");
  EXPECT_EQ(py_json_dumps(ojson::array()), "[]");
  EXPECT_EQ(py_json_dumps(ojson::object()), "{}");
  EXPECT_EQ(py_json_dumps(ojson(1.0)), "1.0");
}

TEST(ParseChatRequest, DeepToolSchemaIsAnError) {
  ojson body = ojson::parse(R"({"messages":[{"role":"user","content":"hi"}],
    "tools":[{"type":"function","function":{"name":"f"}}]})");
  body["tools"][0]["function"]["parameters"] = unbounded_parse(nested_objects(kVeryDeep));
  auto r = parse_chat_request(body, ChatFamily::v41);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "request: nests arrays/objects more than 64 levels deep (this server's limit)");
  body["tools"][0]["function"]["parameters"] = unbounded_parse(nested_objects(50));
  EXPECT_TRUE(parse_chat_request(body, ChatFamily::v41).ok());
}

TEST(EncodeChat, DeepToolCallArgumentsAreAnError) {
  for (ChatFamily family : {ChatFamily::v4, ChatFamily::v41}) {
    ChatRequest req;
    req.options.family = family;
    ChatMessage user;
    user.content = "hi";
    ChatMessage assistant;
    assistant.role = ChatRole::assistant;
    assistant.tool_calls.push_back(ToolCall{"c1", "f", nested_objects(kVeryDeep)});
    req.messages = {user, assistant};
    auto r = encode_chat(req);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message,
              "messages[1].tool_calls[0].function.arguments nests arrays/objects more than 64 levels deep "
              "(this server's limit)");
    // Within the limit the arguments render as before; non-JSON text still falls back to a string.
    req.messages[1].tool_calls[0].arguments = nested_objects(10);
    EXPECT_TRUE(encode_chat(req).ok());
    req.messages[1].tool_calls[0].arguments = std::string(kVeryDeep, '[');
    EXPECT_TRUE(encode_chat(req).ok());
  }
}

}  // namespace
}  // namespace spw
