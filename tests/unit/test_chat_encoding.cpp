// encode_chat() against prompts produced by DeepSeek's official encoders
// (tests/unit/data/chat_goldens_{v4,v41}.json, made by tools/chat/make_chat_goldens.py), plus the
// rejections and the Python-compatible JSON formatting the prompts depend on.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "chat/chat_encoding.h"
#include "chat/py_json.h"

namespace spw {
namespace {

using ojson = nlohmann::ordered_json;

ojson load_goldens(const std::string& family) {
  const std::string path = std::string(SPW_SOURCE_DIR) + "/tests/unit/data/chat_goldens_" + family + ".json";
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ojson::parse(ss.str());
}

// Index of the first differing byte, with context, for readable failures on long prompts.
std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  got:  ..." + got.substr(from, 120) +
         "\n  want: ..." + want.substr(from, 120);
}

void check_family(const std::string& name, ChatFamily family, size_t min_cases) {
  const ojson doc = load_goldens(name);
  ASSERT_GE(doc["cases"].size(), min_cases);
  for (const ojson& c : doc["cases"]) {
    SCOPED_TRACE(name + "/" + c["name"].get<std::string>());
    auto req = parse_chat_request(c["request"], family);
    ASSERT_TRUE(req.ok()) << req.error().message;
    auto prompt = encode_chat(*req);
    ASSERT_TRUE(prompt.ok()) << prompt.error().message;
    const std::string want = c["prompt"].get<std::string>();
    EXPECT_EQ(*prompt, want) << first_difference(*prompt, want);
  }
}

void check_errors(const std::string& name, ChatFamily family) {
  const ojson doc = load_goldens(name);
  ASSERT_FALSE(doc["errors"].empty());
  for (const ojson& c : doc["errors"]) {
    SCOPED_TRACE(name + "/" + c["name"].get<std::string>());
    const std::string want = c["error"].get<std::string>();
    auto req = parse_chat_request(c["request"], family);
    std::string message;
    if (!req.ok()) {
      message = req.error().message;
    } else {
      auto prompt = encode_chat(*req);
      ASSERT_FALSE(prompt.ok()) << "accepted; prompt: " << *prompt;
      message = prompt.error().message;
    }
    EXPECT_NE(message.find(want), std::string::npos) << "message: " << message << "\nwant: " << want;
  }
}

TEST(ChatEncoding, V4MatchesOfficialEncoder) { check_family("v4", ChatFamily::v4, 15); }
TEST(ChatEncoding, V41MatchesOfficialEncoder) { check_family("v41", ChatFamily::v41, 15); }
TEST(ChatEncoding, V4Rejections) { check_errors("v4", ChatFamily::v4); }
TEST(ChatEncoding, V41Rejections) { check_errors("v41", ChatFamily::v41); }

TEST(ChatEncoding, ErrorsNameTheMessage) {
  ChatRequest req;
  req.options.family = ChatFamily::v41;
  req.messages.push_back(ChatMessage{ChatRole::user, "x", {}, "", {}, ""});
  req.messages.push_back(ChatMessage{ChatRole::tool, "r", {}, "", {}, "call_9"});
  auto p = encode_chat(req);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().message,
            "messages[1] (tool): tool_call_id \"call_9\" answers no tool call of the preceding assistant message");
}

TEST(ChatEncoding, TypedStructsWithoutJson) {
  ChatRequest req;
  req.options = {ChatFamily::v4, true, std::string("max")};
  req.tools.push_back(make_tool("f", "d", ojson::parse(R"({"type": "object"})")));
  ChatMessage m;
  m.content = "hi";
  req.messages.push_back(m);
  auto p = encode_chat(req);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->find("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum"), 0u);
  EXPECT_NE(p->find(R"({"name": "f", "description": "d", "parameters": {"type": "object"}})"), std::string::npos);
  EXPECT_TRUE(p->ends_with("tool calls.\n<｜User｜>hi<｜Assistant｜><think>")) << *p;
}

TEST(PyJson, MatchesPythonDumps) {
  // Expected strings are what Python 3.11 json.dumps(..., ensure_ascii=False) prints.
  EXPECT_EQ(py_json_dumps(ojson::parse(R"({"b": [1, 2.0, -0.0, 1e-5, 1e16, 123456789012345.6], "a": null})")),
            R"({"b": [1, 2.0, -0.0, 1e-05, 1e+16, 123456789012345.6], "a": null})");
  EXPECT_EQ(py_json_dumps(ojson::parse(R"([0.1, 1e22, 2.5e-07, 0.0001, 1e15, 12345678901234567890])")),
            R"([0.1, 1e+22, 2.5e-07, 0.0001, 1000000000000000.0, 12345678901234567890])");
  EXPECT_EQ(py_json_dumps(ojson::parse(R"({"s": "é\"\\\n\t\u0001\u007f😀", "e": {}, "l": []})")),
            "{\"s\": \"é\\\"\\\\\\n\\t\\u0001\x7f😀\", \"e\": {}, \"l\": []}");
  EXPECT_EQ(py_float_repr(1.5), "1.5");
  EXPECT_EQ(py_float_repr(-2.5e-300), "-2.5e-300");
  EXPECT_EQ(py_float_repr(9007199254740993.0), "9007199254740992.0");
}

}  // namespace
}  // namespace spw
